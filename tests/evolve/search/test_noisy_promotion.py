"""A candidate that wins its bench once but not on confirmation is not promoted."""
from __future__ import annotations

from pathlib import Path

import pytest

from kcoral import Client

from evolve.config import PromotionConfig, RunConfig
from evolve.families import load_family
from evolve.pipeline import GpuGate, StageContext, run_pipeline
from evolve.population import NewCandidate
from evolve.promotion import Promoter
from evolve.render import render_candidate, source_digest
from tests.evolve.search.conftest import NUMPY_FAMILY
from tests.evolve.search.helpers import WORKLOAD
from tests.serverproc import ServerProcess

# Both sides are one NumPy point (a few ms a call) plus a sleep, so which is faster does not
# hinge on how two algorithms compare on a loaded 2-core machine (CI once saw the chunked point
# run slower than the token loop): the best sleeps 30 ms a call; the noisy fixture 0 ms when
# fast and 90 ms when slow. Load stretches compute, hardly sleeps.
FAST = dict(algorithm="chunked", chunk=16, batching="per_chunk", decay_form="factored", contract="matmul", solve="linalg", dtype="float32")
BEST_SLEEP_S = 0.03
NOISY_SLOW_SLEEP_S = 0.09


def noisy_fixture(dest: Path, fast_dir: Path, mode_file: Path, slow_s: float) -> Path:
    """TEST FIXTURE: the fast NumPy point, slowed by `slow_s` per call while `mode_file` says slow."""
    src = (fast_dir / "solution.py").read_text().replace("def setup(", "def _fast_setup(")
    src += f'''

# ---- test fixture: speed depends on a mode file the test flips between runs ----
import time as _time

MODE_FILE = {str(mode_file)!r}


def setup(data, B, T, H):
    fn = _fast_setup(data, B, T, H)
    with open(MODE_FILE) as f:
        slow = f.read().strip() == "slow"
    if not slow:
        return fn

    def slow_fn():
        fn()
        _time.sleep({slow_s!r})

    return slow_fn
'''
    dest.mkdir(parents=True)
    (dest / "solution.py").write_text(src)
    return dest


@pytest.fixture(scope="module")
def unsandboxed_server():
    """The fixture reads a mode file on this machine from inside the bench, which a
    sandboxed server (rightly) does not allow: a server with --sandbox none."""
    with ServerProcess(["--cpu-workers", "2", "--sandbox", "none"]) as srv:
        yield srv


def test_noisy_winner_is_not_promoted(tmp_path, pop, unsandboxed_server):
    cpu_server = unsandboxed_server
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    stages_cfg = RunConfig.model_fields["stages"].default_factory()
    with Client(cpu_server.url) as client:
        ctx = StageContext(client=client, pop=pop, workload_id=wid, workload_dir=WORKLOAD, run_id=None,
                           stages=stages_cfg, families={fam.name: fam}, gate=GpuGate(client, 1, 4),
                           transport_wait_s=60)
        promoter = Promoter(ctx, PromotionConfig(confirm_runs=2, margin=0.05))

        # 1. the first correct candidate becomes the best after confirmations against the baseline
        fast_dir = render_candidate(fam, FAST, tmp_path / "gen")
        always_slow = tmp_path / "always-slow"
        always_slow.write_text("slow")
        seed_dir = noisy_fixture(tmp_path / "scratch" / "steady", fast_dir, always_slow, BEST_SLEEP_S)
        seed, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=source_digest(seed_dir),
                                                 directory=str(seed_dir), name="steady-fixture"))
        out = run_pipeline(ctx, seed, ["check", "bench"])
        assert out.passed, out
        first = promoter.consider(seed, out.bench)
        assert first.promoted and first.previous_best_id is None
        assert len(first.confirmation_eval_ids) == 2
        assert pop.best(wid).candidate_id == seed.id

        # 2. the noisy candidate benches fast ...
        mode = tmp_path / "mode"
        mode.write_text("fast")
        noisy_dir = noisy_fixture(tmp_path / "scratch" / "noisy", fast_dir, mode, NOISY_SLOW_SLEEP_S)
        noisy, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=source_digest(noisy_dir),
                                                  directory=str(noisy_dir), name="noisy-fixture"))
        out = run_pipeline(ctx, noisy, ["check", "bench"])
        assert out.passed, out
        assert out.bench.speedup > pop.evaluations(seed.id, "bench")[-1].speedup   # it beats the best once

        # 3. ... but is slow when confirmed side by side with the best
        mode.write_text("slow")
        decision = promoter.consider(noisy, out.bench)
    assert decision is not None and not decision.promoted, decision
    assert decision.previous_best_id == seed.id
    assert "not faster" in decision.reason or "does not exceed" in decision.reason
    confirms = pop.evaluations(noisy.id, "confirm")
    assert [e.id for e in confirms] == decision.confirmation_eval_ids and confirms
    assert all(e.status == "passed" and e.speedup < 1.0 for e in confirms), \
        [(e.status, e.failure_kind, e.speedup, e.message[:300]) for e in confirms]   # correct, just slower
    assert pop.best(wid).candidate_id == seed.id
    assert [p.candidate_id for p in pop.promotions(wid)] == [seed.id]
    board = {r.candidate_id: r for r in pop.leaderboard(wid)}
    assert board[seed.id].best and not board[noisy.id].confirmed

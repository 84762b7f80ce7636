"""Cheating candidates against the official benchmark on a real CPU server: none may pass
with a figure the honest code does not earn (tests/fixtures/kda_attacks says what each
one tries). The honest reference, benchmarked the same way, runs at about 1x its baseline."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kcoral.bench import run_bench

from .conftest import CPU_WORKLOAD, REFERENCE

pytestmark = pytest.mark.slow

ATTACKS = Path(__file__).resolve().parents[2] / "fixtures" / "kda_attacks"
# The honest reference against the reference baseline: about 1x (0.8 to 1.3 seen on two
# cores). An attack that passes must stay below this.
INFLATED = 2.0


def stage(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(ATTACKS / name, target)
    shutil.copyfile(REFERENCE / "solution.py", target / "correct.py")
    return target


def verdict(rep) -> str:
    return (f"passed={rep.passed} speedup={rep.speedup} kind={rep.failure_kind} "
            f"message={rep.message[:600]!r}")


# Attacks on a confirmation run: they slow the incumbent timed against them.
ON_INCUMBENT = ("sabotage_incumbent", "edit_incumbent_files")


@pytest.mark.parametrize("name", sorted(p.name for p in ATTACKS.iterdir()
                                        if p.is_dir() and p.name not in ON_INCUMBENT))
def test_attack_earns_no_inflated_figure(client, tmp_path, name):
    rep = run_bench(client, CPU_WORKLOAD, stage(name, tmp_path), timeout=180)
    assert not rep.passed or rep.speedup < INFLATED, verdict(rep)


def test_a_lowered_priority_stops_the_run(client, tmp_path):
    """On the CPU twin's CPU clock a reniced baseline is not slower, so the figure alone
    would not show the attack: the judge must see the priority it left and refuse."""
    rep = run_bench(client, CPU_WORKLOAD, stage("renice_baseline", tmp_path), timeout=180)
    assert not rep.passed and "lowered the scheduling priority" in rep.message, verdict(rep)


def test_a_candidate_cannot_blame_the_server(client, tmp_path):
    """`unavailable` tells the search a point was never judged (it is retried, never learned
    as infeasible). Only the judge's trusted side and a host that failed before it was ready
    may say so: a candidate's host that claims it is running the candidate's code."""
    rep = run_bench(client, CPU_WORKLOAD, stage("blame_the_server", tmp_path), timeout=180)
    assert not rep.passed and rep.failure_kind == "runtime", verdict(rep)
    assert "the GPU fell off the bus" in rep.message, verdict(rep)


@pytest.mark.parametrize("name", ON_INCUMBENT)
def test_challenger_cannot_slow_the_incumbent(client, tmp_path, name):
    rep = run_bench(client, CPU_WORKLOAD, stage(name, tmp_path), timeout=180, against=REFERENCE)
    assert not rep.passed or rep.speedup < INFLATED, verdict(rep)



def test_skipped_host_work_buys_no_room(client, tmp_path):
    """`skip_host_work` skips whatever per-call work its host does besides the call (the cache
    flush) and reports a hundredth of each call. On a workload whose flush costs about as
    much as the call (512 MiB written per call), a judge that leaves that work to the host
    and subtracts it with the no-op batch credits the cheat with it, whichever clock wins:
    there must be no host-side work a candidate can skip. Weighed against the honest code
    benchmarked the same way, since the gain is a share of one call, not a multiple."""
    kda = tmp_path / "kda"
    shutil.copytree(CPU_WORKLOAD.parent / "judge", kda / "judge", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(CPU_WORKLOAD, kda / CPU_WORKLOAD.name)
    spec_path = kda / CPU_WORKLOAD.name / "workload.json"
    spec = json.loads(spec_path.read_text())
    spec["timing"]["flush_bytes"] = 512 << 20
    spec_path.write_text(json.dumps(spec))
    honest = run_bench(client, kda / CPU_WORKLOAD.name, REFERENCE, timeout=240)
    assert honest.passed, verdict(honest)
    rep = run_bench(client, kda / CPU_WORKLOAD.name, stage("skip_host_work", tmp_path), timeout=240)
    print(f"honest {honest.kernel_ms:.3f} ms; cheat {rep.kernel_ms:.3f} ms; {verdict(rep)}")
    # The CPU clock's trial-to-trial noise on a shared 2-core machine is 20-40 %.
    assert not rep.passed or rep.kernel_ms > 0.6 * honest.kernel_ms, verdict(rep)

"""Trust II on the orchestrator: candidate code never runs where evolve runs, and the
static rules read every file of a candidate. Each test is an attack that got through
before (a real server process on loopback, real SQLite files migrated by Alembic)."""
from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from evolve.digest import source_digest
from evolve.families import load_family
from evolve.pipeline import GpuGate, StageContext, run_stage
from evolve.population import NewCandidate, Population
from evolve.render import render_candidate
from kcoral import Client
from tests.evolve.search.conftest import NUMPY_FAMILY, REPO
from tests.evolve.search.helpers import WORKLOAD, cli_env, evolve_cmd, population

FAST = dict(algorithm="chunked", chunk=16, batching="per_chunk", decay_form="factored", contract="matmul", solve="linalg", dtype="float32")
EVOLVE_SECRET = "orchestrator-token-never-leaves-0123"


def honest_candidate(root: Path, helper: str, extra: dict[str, str] | None = None) -> Path:
    """A correct numpy kernel whose solution.py imports a helper module beside it."""
    d = render_candidate(load_family(NUMPY_FAMILY), FAST, root / "render")
    cand = root / "agent" / "sneaky"
    cand.mkdir(parents=True)
    (cand / "solution.py").write_text("import helper  # noqa: F401\n" + (d / "solution.py").read_text())
    (cand / "helper.py").write_text(textwrap.dedent(helper))
    for name, text in (extra or {}).items():
        (cand / name).parent.mkdir(parents=True, exist_ok=True)
        (cand / name).write_text(text)
    return cand


def check_stage(pop: Population, client: Client, cand_dir: Path):
    from evolve.config import RunConfig

    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    ctx = StageContext(client=client, pop=pop, workload_id=wid, workload_dir=WORKLOAD, run_id=None,
                       stages=RunConfig.model_fields["stages"].default_factory(), families={},
                       gate=GpuGate(client, 1, 4), transport_wait_s=10)
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=source_digest(cand_dir),
                                             directory=str(cand_dir)))
    return run_stage(ctx, "check", cand)[1]


# The attack: at import, a helper finds evolve's database and token in its environment,
# forges a passed 99x bench and a promotion with evolve's own API, and keeps the token.
FORGER = """
import json, os
_db, _token = os.environ.get("EVOLVE_DB"), os.environ.get("KCORAL_TOKEN")
with open(LEAK, "a") as fh:
    fh.write(json.dumps({"token": _token, "db": _db}) + "\\n")
if _db:
    from evolve.population import Population, StageResult
    pop = Population.open(_db)
    me = max(pop.candidates(), key=lambda c: c.id)
    eid = pop.begin_stage(me.id, "bench")
    pop.finish_stage(eid, StageResult(status="passed", ms=0.01, baseline_ms=0.99, speedup=99.0, spread=0.0))
    conf = pop.begin_stage(me.id, "confirm")
    pop.finish_stage(conf, StageResult(status="passed", ms=0.01, baseline_ms=0.99, speedup=99.0, spread=0.0))
    pop.promote(me.id, None, [conf], 0.0, 99.0)
"""


def test_a_helper_module_cannot_forge_the_leaderboard_or_read_the_token(tmp_path, cpu_server):
    db_path = tmp_path / "evolve.db"
    leak = tmp_path / "leak.jsonl"
    pop = population(f"sqlite:///{db_path}")  # created and migrated by Alembic
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    cand_dir = honest_candidate(tmp_path, f"LEAK = {str(leak)!r}\n" + FORGER)
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=source_digest(cand_dir),
                                             directory=str(cand_dir), name="sneaky"))
    config = tmp_path / "check-only.toml"
    config.write_text(f'root = "{REPO}"\nworkload = "kcoral/workloads/kda/forward_cpu_small"\n'
                      '[[families]]\nname = "numpy_chunked"\n'
                      "[stages.gputest]\nenabled = false\n[stages.bench]\nenabled = false\n")
    env = dict(cli_env(), EVOLVE_DB=f"sqlite:///{db_path}", KCORAL_TOKEN=EVOLVE_SECRET)
    proc = subprocess.run(evolve_cmd("evaluate", str(cand.id), "--remote", cpu_server.url, "--config", str(config)),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert pop.best(wid) is None, "the helper promoted itself"
    assert not [e for e in pop.evaluations(cand.id) if e.stage in ("bench", "confirm")]
    assert pop.leaderboard(wid) == []
    leaked = leak.read_text() if leak.exists() else ""
    assert EVOLVE_SECRET not in leaked and str(db_path) not in leaked


def test_the_import_probe_runs_on_the_server_not_in_evolve(tmp_path, pop, client, monkeypatch):
    # The helper reports where it was imported by failing with what it saw.
    monkeypatch.setenv("KCORAL_TOKEN", EVOLVE_SECRET)
    monkeypatch.setenv("EVOLVE_DB", f"sqlite:///{tmp_path / 'evolve.db'}")
    cand_dir = honest_candidate(tmp_path, """
        import os
        seen = {k: os.environ.get(k) for k in ("KCORAL_WORKER_ID", "KCORAL_TOKEN", "EVOLVE_DB")}
        raise RuntimeError(f"probe-saw {seen} parent={os.getppid()}")
    """)
    res = check_stage(pop, client, cand_dir)
    assert res.status == "failed" and res.failure_kind == "import" and "probe-saw" in res.message, res.message
    assert f"parent={os.getpid()}" not in res.message       # not a child of evolve
    assert "'KCORAL_WORKER_ID': 'cpu/" in res.message        # a server worker imported it
    assert EVOLVE_SECRET not in res.message and "evolve.db" not in res.message


@pytest.mark.parametrize("name, text, needle", [
    ("helper.py", "import subprocess\n", "helper.py:1: import of subprocess"),
    ("helper.py", "import os\nos.system('true')\n", "helper.py:2: os.system"),
    ("pkg/deep.py", "import os\nx = os.popen\n", "pkg/deep.py:2: os.popen"),
    ("native.so", "\x7fELF", "native.so: compiled native code"),
])
def test_static_rules_read_every_file_of_the_candidate(tmp_path, pop, client, name, text, needle):
    cand_dir = honest_candidate(tmp_path, "X = 1\n", extra={name: text})
    res = check_stage(pop, client, cand_dir)
    assert res.status == "failed" and res.failure_kind == "check", res.message
    assert needle in res.message, res.message


def test_a_cheat_that_computes_only_on_poisoned_calls_is_never_promoted(tmp_path, cpu_server):
    """Trust I through the pipeline: the NaN-gated candidate (computes only when its output
    holds the judge's poison) was promoted at 779x over the best by `evolve evaluate`."""
    db_path = tmp_path / "evolve.db"
    pop = population(f"sqlite:///{db_path}")
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    honest = render_candidate(load_family(NUMPY_FAMILY), FAST, tmp_path / "render")
    cand_dir = tmp_path / "agent" / "nan_gate"
    cand_dir.mkdir(parents=True)
    (cand_dir / "correct.py").write_text((honest / "solution.py").read_text())
    (cand_dir / "solution.py").write_text((REPO / "tests/fixtures/kda_attacks/nan_gate/solution.py").read_text())
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=source_digest(cand_dir),
                                             directory=str(cand_dir), name="nan_gate"))
    config = tmp_path / "bench.toml"
    config.write_text(f'root = "{REPO}"\nworkload = "kcoral/workloads/kda/forward_cpu_small"\n'
                      '[[families]]\nname = "numpy_chunked"\n')
    proc = subprocess.run(evolve_cmd("evaluate", str(cand.id), "--remote", cpu_server.url, "--config", str(config)),
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    timed = [e for e in pop.evaluations(cand.id) if e.stage in ("bench", "confirm") and e.speedup is not None]
    assert timed, proc.stdout[-3000:] + proc.stderr[-3000:]
    # It computes on every call now (every call is poisoned and checked): an honest figure.
    assert all(e.speedup < 5.0 for e in timed), [(e.stage, e.speedup) for e in timed]


def test_what_a_stage_sends_is_what_was_registered(tmp_path, client, monkeypatch):
    # A stage checked the folder's digest and then read the folder again to send it: an
    # agent that swapped a file between the two had other sources run (red team: 4 of 25
    # check stages imported the swapped file). Here the swap lands right after the check,
    # every time: the import probe swaps solution.py before it stages what it was given.
    from evolve.pipeline import check

    pop = population(f"sqlite:///{tmp_path / 'evolve.db'}")
    cand_dir = honest_candidate(tmp_path, "VALUE = 1\n")
    real_probe = check.probe

    def swapped_first(client, directory, timeout):
        (cand_dir / "solution.py").write_text("raise ImportError('SWAPPED-SOURCES-RAN')\n")
        return real_probe(client, directory, timeout)

    monkeypatch.setattr(check, "probe", swapped_first)
    result = check_stage(pop, client, cand_dir)
    assert "SWAPPED-SOURCES-RAN" not in result.message, result.message
    assert result.status == "passed", result.message


def test_a_result_the_database_refuses_closes_its_row(tmp_path, client, monkeypatch):
    # The row used to stay `running` (and every --resume ran the stage again) when the
    # database refused what a candidate had printed into its result.
    from sqlalchemy.exc import DataError

    pop = population(f"sqlite:///{tmp_path / 'evolve.db'}")
    cand_dir = honest_candidate(tmp_path, "VALUE = 1\n")
    real_finish = pop.finish_stage
    refused: list[int] = []

    def refuse_once(eid, result):
        if not refused:
            refused.append(eid)
            raise DataError("UPDATE evaluations", {}, Exception("a value the backend refuses"))
        return real_finish(eid, result)

    monkeypatch.setattr(pop, "finish_stage", refuse_once)
    result = check_stage(pop, client, cand_dir)
    (row,) = [e for c in pop.candidates() for e in pop.evaluations(c.id) if e.id == refused[0]]
    assert row.status == "failed" and "could not be recorded" in row.message
    assert result.status == "failed"

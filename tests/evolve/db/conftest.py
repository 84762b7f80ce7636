from __future__ import annotations

from collections.abc import Iterator

import pytest

from evolve.db import Database, open_database
from evolve.population import NewCandidate, Population, StageLogs, StageResult


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    yield database
    database.close()


@pytest.fixture
def pop(db: Database) -> Population:
    return Population(db)


@pytest.fixture
def workload(pop: Population) -> int:
    return pop.ensure_workload(name="forward_cpu_small", path="kcoral/workloads/kda/forward_cpu_small")


def make_candidate(pop: Population, workload_id: int, digest: str, **fields: object) -> int:
    fields.setdefault("origin", "template")
    fields.setdefault("directory", f"kcoral/workloads/kda/forward_cpu_small/gen/{digest}")
    cand, _ = pop.add_candidate(NewCandidate(workload_id=workload_id, digest=digest, **fields))
    return cand.id


def finish(pop: Population, candidate_id: int, stage: str, result: StageResult, run_id: int | None = None) -> int:
    eid = pop.begin_stage(candidate_id, stage, run_id=run_id)
    assert eid is not None
    assert pop.finish_stage(eid, result)
    return eid


def populate(pop: Population, workload_id: int) -> dict[str, int]:
    """A small search: a seed, two children, a failure, a promotion chain."""
    run = pop.start_run(workload_id, {"strategy": "evolution"}, "evolution")
    seed = make_candidate(pop, workload_id, "seed", origin="seed", name="seed", run_id=run)
    fast = make_candidate(pop, workload_id, "fast", family="two_pass", params={"chunk": 64}, parents=[seed],
                          generation=1, operator="mutate", run_id=run)
    slow = make_candidate(pop, workload_id, "slow", origin="agent", author="agent-7", name="slow-exp")
    broken = make_candidate(pop, workload_id, "broken", family="two_pass", parents=[fast, seed], generation=2,
                            operator="crossover", run_id=run)
    for cid, speedup, ms in ((seed, 1.0, 2.0), (fast, 3.0, 0.667), (slow, 1.5, 1.333)):
        finish(pop, cid, "check", StageResult(status="passed", registers=96, spills=0), run)
        finish(pop, cid, "bench", StageResult(status="passed", ms=ms, baseline_ms=2.0, speedup=speedup, spread=0.01,
                                              queue_ms=12.0, lease_held_ms=900.0, gpu="0"), run)
    finish(pop, fast, "ncu", StageResult(status="passed", excessive_sectors=6144), run)
    finish(pop, broken, "check", StageResult(status="failed", failure_kind="compile",
                                             message="kda_prep.cu(12): error: identifier undefined",
                                             metrics={"stderr_tail": "nvcc failed\nline two"}), run)
    c1 = finish(pop, seed, "confirm", StageResult(status="passed", speedup=1.0), run)
    pop.promote(seed, None, [c1], margin=0.02, speedup_over_best=None)
    c2 = finish(pop, fast, "confirm", StageResult(status="passed", speedup=2.9), run)
    pop.promote(fast, seed, [c2], margin=0.02, speedup_over_best=2.9)
    return {"run": run, "seed": seed, "fast": fast, "slow": slow, "broken": broken}


def add_tools_and_a_crash(pop: Population, workload_id: int, ids: dict[str, int]) -> int:
    """After `populate`: IKET and NCU results for "slow", and a child of "fast" whose bench
    crashed with a message holding markup and stored logs. Returns the crashed one's id."""
    run = ids["run"]
    finish(pop, ids["slow"], "iket", StageResult(status="passed", metrics={"traces": {"trace.json": {
        "stages": {"w0:prep": {"count": 4, "mean_us": 12.5, "period_us": 41.75}, "w1:state": {"count": 4, "mean_us": 30.25}},
        "span_us": 170.0}}}), run)
    finish(pop, ids["slow"], "ncu", StageResult(status="passed", excessive_sectors=6144, metrics={"kernels": [
        {"name": "kda_prep_kernel", "duration_ns": 731000.0, "sectors_excessive": 6144, "registers": 96}]}), run)
    crash = make_candidate(pop, workload_id, "crash", family="two_pass", parents=[ids["fast"]], generation=2,
                           operator="mutate", run_id=run)
    finish(pop, crash, "bench", StageResult(
        status="failed", failure_kind="runtime", message="ValueError: chunk must divide T <script>alert(1)</script>",
        logs=StageLogs(stderr="warming up\n", traceback="Traceback (most recent call last):\nValueError: chunk")), run)
    return crash

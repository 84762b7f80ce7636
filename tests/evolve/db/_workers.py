"""Functions run in child processes (spawned) by the concurrency tests."""
from __future__ import annotations

import time
from typing import Any

from evolve.db import open_database
from evolve.population import Population, StageResult


def claim(url: str, candidate_ids: list[int], stage: str, start: Any, results: Any) -> None:
    pop = Population(open_database(url))
    start.wait()
    won = [cid for cid in candidate_ids if pop.begin_stage(cid, stage) is not None]
    results.put(won)


def write_evaluations(url: str, candidate_id: int, stop_file: str, out_file: str) -> None:
    """Claim and finish "confirm" attempts until `stop_file` exists; write the count."""
    pop = Population(open_database(url))
    done = 0
    while True:
        eid = pop.begin_stage(candidate_id, "confirm")
        assert eid is not None
        assert pop.finish_stage(eid, StageResult(status="passed", speedup=1.0 + done * 1e-6))
        done += 1
        try:
            open(stop_file).close()
            break
        except FileNotFoundError:
            time.sleep(0.001)
    with open(out_file, "w") as fh:
        fh.write(str(done))


def open_fresh(url: str, name: str, start: Any, results: Any) -> None:
    """Open a database that may not exist yet (all workers race to migrate it)."""
    start.wait()
    try:
        pop = Population(open_database(url))
        results.put(("ok", pop.ensure_workload(name, f"kcoral/workloads/kda/{name}")))
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with the message
        results.put(("error", repr(exc)))


def claim_waiting(url: str, workload_id: int, start: Any, results: Any) -> None:
    """Claim waiting candidates one at a time until none is left (as `evolve run` does)."""
    pop = Population(open_database(url))
    worker = None
    start.wait()
    won = []
    while (claim := pop.claim_next(workload_id, "check", worker_id=worker)) is not None:
        won.append(claim[0].id)
    results.put(won)

"""Several processes on one run: workers, their heartbeat leases, claims of waiting
candidates, and single promotions, on SQLite and PostgreSQL."""
from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
from sqlalchemy import update

from evolve.db.models import RunWorkerModel, utcnow
from evolve.population import Population, StageResult

from . import _workers
from .conftest import make_candidate


def _age_worker(pop: Population, worker_id: int, seconds: float) -> None:
    """Make a worker's last heartbeat `seconds` old (as if its process stopped beating)."""
    from datetime import timedelta

    with pop.db.write() as s:
        s.execute(update(RunWorkerModel).where(RunWorkerModel.id == worker_id)
                  .values(heartbeat_at=utcnow() - timedelta(seconds=seconds)))


def test_a_run_ends_when_its_last_worker_leaves(pop: Population, workload: int) -> None:
    run = pop.start_run(workload, {}, "evolution")
    first = pop.join_run(run)
    second = pop.join_run(run, host="gpu-node-2", pid=4242)
    assert [w.id for w in pop.workers(run)] == [first, second]
    assert pop.heartbeat_worker(second)
    assert not pop.leave_run(first, "finished")            # the other one is still working
    assert pop.run(run).state == "running" and pop.run_alive(pop.run(run))  # type: ignore[arg-type]
    assert not pop.heartbeat_worker(first)                  # it has left: no lease to renew
    from evolve.commands.status import render_status, status_doc

    assert "1 of 2 worker(s) alive: gpu-node-2:4242" in render_status(pop)
    assert [w["alive"] for w in status_doc(pop)["runs"][0]["workers"]] == [False, True]
    assert pop.leave_run(second, "finished")
    ended = pop.run(run)
    assert ended is not None and ended.state == "finished" and ended.ended_at is not None
    assert all(w.ended_at is not None for w in pop.workers(run))
    with pytest.raises(ValueError, match="not running"):
        pop.join_run(run)
    with pytest.raises(KeyError):
        pop.join_run(run + 100)


def test_a_worker_that_stops_beating_loses_its_evaluations(pop: Population, workload: int) -> None:
    run = pop.start_run(workload, {}, "evolution")
    alive = pop.join_run(run, host="host-a", pid=1)
    dead = pop.join_run(run, host="host-b", pid=2)
    a, b = make_candidate(pop, workload, "a"), make_candidate(pop, workload, "b")
    held = pop.begin_stage(a, "bench", run_id=run, worker_id=alive)
    lost = pop.begin_stage(b, "bench", run_id=run, worker_id=dead)
    assert held is not None and lost is not None
    assert pop.evaluation(lost).worker_id == dead  # type: ignore[union-attr]
    assert pop.interrupted(run) == []
    _age_worker(pop, dead, pop.heartbeat_timeout_s + 5)
    assert pop.run_alive(pop.run(run))  # type: ignore[arg-type]   # the run goes on with the live worker
    assert [e.id for e in pop.interrupted(run)] == [lost]
    # Reclaimed once: the second survivor's compare-and-set finds it taken.
    assert pop.mark_interrupted(lost, "interrupted: worker stopped beating")
    assert not pop.mark_interrupted(lost)
    retry = pop.begin_stage(b, "bench", run_id=run, retry_of=lost, worker_id=alive)
    assert retry is not None and pop.evaluation(retry).attempt == 2  # type: ignore[union-attr]
    # The dead worker's late result is dropped, not recorded over the retry.
    assert not pop.finish_stage(lost, StageResult(status="passed", speedup=9.0))
    # Its lease expired but it has not left: when the live worker leaves, the run ends.
    assert pop.leave_run(alive, "finished")


def test_leaving_while_stages_finish_keeps_the_lease(pop: Population, workload: int) -> None:
    """Ctrl-C: the run is marked interrupted at once, the worker's stages in flight stay its own."""
    run = pop.start_run(workload, {}, "evolution")
    worker = pop.join_run(run)
    cid = make_candidate(pop, workload, "c")
    eid = pop.begin_stage(cid, "check", run_id=run, worker_id=worker)
    assert eid is not None
    assert pop.leave_run(worker, "interrupted", still_working=True)
    assert pop.run(run).state == "interrupted"  # type: ignore[union-attr]
    assert pop.workers(run)[0].ended_at is None
    assert pop.finish_stage(eid, StageResult(status="passed"))
    assert not pop.leave_run(worker, "interrupted")   # the run had ended already
    assert pop.workers(run)[0].ended_at is not None


def test_claims_hand_out_each_waiting_candidate_once(pop: Population, workload: int) -> None:
    ids = [make_candidate(pop, workload, f"w{i}", origin="agent") for i in range(3)]
    first = pop.claim_next(workload, "check")
    assert first is not None and first[0].id == ids[0]
    assert pop.claim_new(ids[0], "check") is None            # taken
    assert pop.claim_new(ids[1], "check") is not None
    third = pop.claim_next(workload, "check")
    assert third is not None and third[0].id == ids[2]
    assert pop.claim_next(workload, "check") is None
    # A candidate evaluated before (even one that failed) is not new.
    eid = third[1]
    assert pop.finish_stage(eid, StageResult(status="failed", failure_kind="compile"))
    assert pop.claim_new(ids[2], "check") is None


def test_a_claim_leaves_candidates_it_cannot_use_to_others(pop: Population, workload: int) -> None:
    """A process on another host may not see an agent's folder: it passes over it."""
    here = make_candidate(pop, workload, "here", origin="agent", directory="scratch/here")
    there = make_candidate(pop, workload, "there", origin="agent", directory="/elsewhere/there")
    mine = pop.claim_next(workload, "check", usable=lambda c: not c.directory.startswith("/elsewhere"))
    assert mine is not None and mine[0].id == here
    assert pop.claim_next(workload, "check", usable=lambda c: not c.directory.startswith("/elsewhere")) is None
    theirs = pop.claim_next(workload, "check")
    assert theirs is not None and theirs[0].id == there


def test_processes_claiming_at_once_get_different_candidates(db_url: str, pop: Population, workload: int) -> None:
    ids = [make_candidate(pop, workload, f"q{i}", origin="agent") for i in range(24)]
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=_workers.claim_waiting, args=(db_url, workload, start, results)) for _ in range(3)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    start.set()
    won = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    claimed = sorted(cid for batch in won for cid in batch)
    assert claimed == ids                                   # each exactly once
    for cid in ids:
        assert len(pop.evaluations(cid)) == 1


def test_racing_promotions_leave_one_best(db_url: str, pop: Population, workload: int) -> None:
    """Two processes confirm different challengers against the same best at once: one is
    promoted, the other is told the best changed (promote is compare-and-set on the best)."""
    seed = make_candidate(pop, workload, "seed", origin="seed")
    c0 = pop.begin_stage(seed, "confirm")
    assert c0 is not None and pop.finish_stage(c0, StageResult(status="passed", speedup=1.0))
    assert pop.promote(seed, None, [c0], None, None) is not None
    challengers = [make_candidate(pop, workload, f"ch{i}") for i in range(6)]
    confirmations = []
    for cid in challengers:
        eid = pop.begin_stage(cid, "confirm")
        assert eid is not None and pop.finish_stage(eid, StageResult(status="passed", speedup=1.5))
        confirmations.append(eid)
    pops = [Population.open(db_url) for _ in challengers]   # one connection pool each, as separate hosts have
    barrier = threading.Barrier(len(challengers))
    outcomes: list[object] = [None] * len(challengers)

    def promote(i: int) -> None:
        barrier.wait()
        outcomes[i] = pops[i].promote(challengers[i], seed, [confirmations[i]], 0.02, 1.5)

    threads = [threading.Thread(target=promote, args=(i,)) for i in range(len(challengers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for p in pops:
        p.close()
    winners = [o for o in outcomes if o is not None]
    assert len(winners) == 1
    chain = pop.promotions(workload)
    assert [p.previous_best_id for p in chain] == [None, seed]
    assert pop.best(workload).candidate_id == winners[0].candidate_id  # type: ignore[union-attr, attr-defined]


def test_a_proposal_is_stored_and_claimed_at_once(pop: Population, workload: int) -> None:
    """Between storing a proposal and claiming it, no other process may take it for a
    waiting registration: add_and_claim does both in one transaction."""
    from evolve.population import NewCandidate

    new = NewCandidate(workload_id=workload, origin="template", digest="p1", directory="gen/p1")
    cand, created, eid = pop.add_and_claim(new, "check")
    assert created and eid is not None and pop.evaluation(eid).candidate_id == cand.id  # type: ignore[union-attr]
    assert pop.claim_next(workload, "check") is None           # never visible as waiting
    again, created, eid2 = pop.add_and_claim(new, "check")
    assert again.id == cand.id and not created and eid2 is None  # known and taken: a duplicate
    waiting = make_candidate(pop, workload, "p2", origin="agent")
    same = NewCandidate(workload_id=workload, origin="template", digest="p2", directory="gen/p2")
    found, created, eid3 = pop.add_and_claim(same, "check")     # proposed what an agent registered
    assert found.id == waiting and not created and eid3 is not None


def test_the_loop_retries_what_a_lost_worker_held_once(pop: Population, workload: int, tmp_path) -> None:
    """SearchLoop._reclaim, as each live worker calls it on its heartbeat: the lost
    worker's running stage becomes one retry job, for one survivor only, and a candidate
    whose folder this host cannot see is left alone."""
    from evolve.loop import SearchLoop

    run = pop.start_run(workload, {}, "evolution")
    alive, other, lost = pop.join_run(run), pop.join_run(run), pop.join_run(run, host="gone-host", pid=7)
    seen = make_candidate(pop, workload, "seen", directory=str(tmp_path))
    unseen = make_candidate(pop, workload, "unseen", directory=str(tmp_path / "elsewhere"))
    held = pop.begin_stage(seen, "bench", run_id=run, worker_id=lost)
    hidden = pop.begin_stage(unseen, "check", run_id=run, worker_id=lost)
    mine = make_candidate(pop, workload, "mine")
    assert pop.begin_stage(mine, "check", run_id=run, worker_id=alive) is not None
    _age_worker(pop, lost, pop.heartbeat_timeout_s + 5)

    loop = object.__new__(SearchLoop)     # only its population is used here
    loop.pop = pop
    usable = lambda cand: __import__("pathlib").Path(cand.directory).is_dir()
    jobs = SearchLoop._reclaim(loop, run, alive, usable)
    assert [(j.candidate_id, j.retry_of) for j in jobs] == [(seen, {"bench": held})]
    assert SearchLoop._reclaim(loop, run, other, usable) == []     # already taken by the first
    assert pop.evaluation(held).status == "interrupted"  # type: ignore[union-attr]
    assert pop.evaluation(hidden).status == "running"    # type: ignore[union-attr]   # for a host that sees it

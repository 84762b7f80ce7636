from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import text, update
from sqlalchemy.exc import IntegrityError

from evolve.db.models import RunModel, utcnow
from evolve.population import NewCandidate, Population, StageResult

from .conftest import finish, make_candidate

PASSED = StageResult(status="passed", ms=1.0, baseline_ms=2.0, speedup=2.0)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_identical_sources_are_deduplicated(pop: Population, workload: int) -> None:
    first, created = pop.add_candidate(
        NewCandidate(workload_id=workload, origin="agent", digest="abc", directory="scratch/a", author="ann")
    )
    again, created_again = pop.add_candidate(
        NewCandidate(workload_id=workload, origin="agent", digest="abc", directory="scratch/b")
    )
    assert created and not created_again
    assert again.id == first.id and again.directory == "scratch/a"
    other = pop.ensure_workload("other", "kcoral/workloads/kda/other")
    third, created_third = pop.add_candidate(
        NewCandidate(workload_id=other, origin="agent", digest="abc", directory="scratch/a")
    )
    assert created_third and third.id != first.id  # dedup is per workload


def test_parents_keep_their_order_and_must_exist(pop: Population, workload: int) -> None:
    a = make_candidate(pop, workload, "a", origin="seed")
    b = make_candidate(pop, workload, "b", origin="seed")
    child = make_candidate(pop, workload, "c", parents=[b, a], generation=1, operator="crossover")
    got = pop.candidate(child)
    assert got is not None and got.parents == [b, a]
    assert [c.id for c in pop.children(a)] == [child]
    assert [(d, c.id) for d, c in pop.ancestors(child)] == [(1, b), (1, a)]
    with pytest.raises(KeyError, match="parent"):
        make_candidate(pop, workload, "d", parents=[999])
    with pytest.raises(ValidationError):
        NewCandidate(workload_id=workload, origin="alien", digest="x", directory="d")  # type: ignore[arg-type]
    assert pop.candidate_by_directory("kcoral/workloads/kda/forward_cpu_small/gen/c").id == child  # type: ignore[union-attr]


def test_begin_stage_claims_once_until_failure(pop: Population, workload: int) -> None:
    cid = make_candidate(pop, workload, "x")
    first = pop.begin_stage(cid, "check")
    assert first is not None
    assert pop.begin_stage(cid, "check") is None  # running
    assert pop.finish_stage(first, StageResult(status="failed", failure_kind="transport", message="reset"))
    retry = pop.begin_stage(cid, "check", retry_of=first)
    assert retry is not None
    ev = pop.evaluation(retry)
    assert ev is not None and ev.attempt == 2 and ev.retry_of == first and ev.status == "running"
    assert pop.finish_stage(retry, StageResult(status="passed"))
    assert pop.begin_stage(cid, "check") is None  # passed
    assert pop.begin_stage(cid, "gputest") is not None  # other stages are independent


def test_confirm_stage_repeats(pop: Population, workload: int) -> None:
    cid = make_candidate(pop, workload, "x")
    ids = [pop.begin_stage(cid, "confirm") for _ in range(3)]
    assert None not in ids
    assert [e.attempt for e in pop.evaluations(cid, stage="confirm")] == [1, 2, 3]


def test_begin_stage_rejects_bad_references(pop: Population, workload: int) -> None:
    cid = make_candidate(pop, workload, "x")
    other = make_candidate(pop, workload, "y")
    with pytest.raises(KeyError):
        pop.begin_stage(12345, "check")
    running = pop.begin_stage(other, "check")
    assert running is not None
    with pytest.raises(ValueError, match="candidate"):
        pop.begin_stage(cid, "check", retry_of=running)
    with pytest.raises(ValueError, match="still running"):
        pop.begin_stage(other, "check", retry_of=running)
    with pytest.raises(ValueError, match="bad stage"):
        pop.begin_stage(cid, "")
    assert pop.evaluations(cid) == []  # nothing was written by the refused calls


def test_finish_stage_is_compare_and_set(pop: Population, workload: int) -> None:
    cid = make_candidate(pop, workload, "x")
    eid = pop.begin_stage(cid, "bench")
    assert eid is not None
    assert pop.finish_stage(eid, PASSED)
    assert not pop.finish_stage(eid, StageResult(status="failed", failure_kind="runtime"))
    ev = pop.evaluation(eid)
    assert ev is not None and ev.status == "passed" and ev.speedup == 2.0 and ev.failure_kind is None
    assert ev.ended_at is not None and ev.duration_s is not None and ev.duration_s >= 0
    # an interrupted row can't be finished either
    eid2 = pop.begin_stage(cid, "ncu")
    assert eid2 is not None and pop.mark_interrupted(eid2)
    assert not pop.mark_interrupted(eid2)
    assert not pop.finish_stage(eid2, PASSED)
    assert pop.evaluation(eid2).status == "interrupted"  # type: ignore[union-attr]


def test_stage_result_validation() -> None:
    with pytest.raises(ValidationError, match="failure_kind"):
        StageResult(status="failed")
    with pytest.raises(ValidationError):
        StageResult(status="failed", failure_kind="gremlins")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        StageResult(status="passed", failure_kind="compile")
    with pytest.raises(ValidationError):
        StageResult(status="running")  # type: ignore[arg-type]


def test_interrupted_finds_rows_of_dead_runs_only(pop: Population, workload: int) -> None:
    cid = make_candidate(pop, workload, "x")
    live = pop.start_run(workload, {}, "evolution")  # this process: alive
    dead = pop.start_run(workload, {}, "evolution", pid=dead_pid())
    stale = pop.start_run(workload, {}, "evolution")
    remote = pop.start_run(workload, {}, "evolution", pid=dead_pid(), host="elsewhere")  # pid not checkable
    with pop.db.write() as s:
        s.execute(update(RunModel).where(RunModel.id == stale).values(heartbeat_at=utcnow() - timedelta(hours=1)))
    e_live = pop.begin_stage(cid, "check", run_id=live)
    e_dead = pop.begin_stage(cid, "gputest", run_id=dead)
    e_stale = pop.begin_stage(cid, "ncu", run_id=stale)
    e_remote = pop.begin_stage(cid, "iket", run_id=remote)
    assert pop.interrupted(live) == []
    assert [e.id for e in pop.interrupted(dead)] == [e_dead]
    assert [e.id for e in pop.interrupted(stale)] == [e_stale]
    assert pop.interrupted(remote) == []
    assert {e.id for e in pop.interrupted()} == {e_dead, e_stale}
    assert [e.id for e in pop.interrupted(heartbeat_timeout_s=0)] == [e_live, e_dead, e_stale, e_remote]
    # a run that ended leaves its running rows orphaned, whatever its pid
    assert pop.finish_run(live, "finished") and not pop.finish_run(live, "failed")
    assert [e.id for e in pop.interrupted(live)] == [e_live]
    # resume: mark, then retry as a new attempt
    assert pop.mark_interrupted(e_dead)
    retry = pop.begin_stage(cid, "gputest", run_id=live, retry_of=e_dead)
    assert retry is not None and pop.evaluation(retry).attempt == 2  # type: ignore[union-attr]
    assert pop.interrupted(dead) == []


def test_heartbeat_keeps_a_run_alive(pop: Population, workload: int) -> None:
    rid = pop.start_run(workload, {"budget": 3}, "random")
    with pop.db.write() as s:
        s.execute(update(RunModel).where(RunModel.id == rid).values(heartbeat_at=utcnow() - timedelta(hours=1)))
    assert not pop.run_alive(pop.run(rid))  # type: ignore[arg-type]
    assert pop.heartbeat_run(rid)
    assert pop.run_alive(pop.run(rid))  # type: ignore[arg-type]
    assert pop.finish_run(rid, "interrupted")
    assert not pop.heartbeat_run(rid)
    run = pop.run(rid)
    assert run is not None and run.state == "interrupted" and run.ended_at is not None and run.config == {"budget": 3}
    with pytest.raises(ValueError):
        pop.finish_run(rid, "running")


def test_unevaluated_and_correct(pop: Population, workload: int) -> None:
    a, b, c = (make_candidate(pop, workload, d) for d in "abc")
    ea = pop.begin_stage(a, "bench")
    pop.finish_stage(ea, StageResult(status="passed", speedup=1.5))  # type: ignore[arg-type]
    eb = pop.begin_stage(b, "bench")
    pop.finish_stage(eb, StageResult(status="failed", failure_kind="correctness"))  # type: ignore[arg-type]
    assert [x.id for x in pop.unevaluated(workload)] == [c]
    assert [(x.id, s) for x, s in pop.correct(workload)] == [(a, 1.5)]
    assert pop.bench_speedup(a) == 1.5 and pop.bench_speedup(b) is None and pop.bench_speedup(c) is None


def test_promote_is_compare_and_set_on_the_best(pop: Population, workload: int) -> None:
    a, b, c = (make_candidate(pop, workload, d) for d in "abc")
    assert pop.best(workload) is None
    conf = [pop.begin_stage(a, "confirm"), pop.begin_stage(a, "confirm")]
    first = pop.promote(a, None, conf, margin=0.02, speedup_over_best=None)  # type: ignore[arg-type]
    assert first is not None and first.confirmation_eval_ids == conf
    assert pop.best(workload) == first
    assert pop.promote(b, None, [], 0.02, 1.1) is None  # someone else promoted first
    second = pop.promote(b, a, [], 0.02, 1.1)
    assert second is not None and pop.best(workload).candidate_id == b  # type: ignore[union-attr]
    with pytest.raises(KeyError):
        pop.promote(c, b, [99999], 0.02, 1.0)
    assert [p.candidate_id for p in pop.promotions(workload)] == [a, b]


def test_workload_lookup(pop: Population, workload: int) -> None:
    assert pop.ensure_workload("forward_cpu_small", "elsewhere") == workload
    assert pop.workload_id("forward_cpu_small") == workload
    assert pop.workload_id(str(workload)) == workload
    assert pop.workload(workload).path == "kcoral/workloads/kda/forward_cpu_small"  # type: ignore[union-attr]
    with pytest.raises(KeyError):
        pop.workload_id("nope")


def test_claim_index_rejects_a_second_live_row(pop: Population, workload: int) -> None:
    """The database itself refuses two running/passed rows of one (candidate, stage), so
    begin_stage stays race-free even where writers are not serialised."""
    cid = make_candidate(pop, workload, "x")
    assert pop.begin_stage(cid, "bench") is not None
    assert pop.begin_stage(cid, "confirm") is not None
    insert = text(
        "INSERT INTO evaluations (candidate_id, stage, attempt, status, message, metrics, started_at) "
        "VALUES (:c, :s, :a, 'running', '', '{}', '2026-01-01 00:00:00')"
    )
    with pytest.raises(IntegrityError, match="(?i)unique"):   # SQLite: UNIQUE constraint; PostgreSQL: unique constraint
        with pop.db.write() as s:
            s.execute(insert, {"c": cid, "s": "bench", "a": 7})
    with pop.db.write() as s:  # repeatable stage: a second live attempt is fine
        s.execute(insert, {"c": cid, "s": "confirm", "a": 7})
    assert len(pop.evaluations(cid, stage="bench")) == 1
    assert len(pop.evaluations(cid, stage="confirm")) == 2


def test_run_throughput_counts_finished_stages_of_that_run(pop: Population, workload: int) -> None:
    from .conftest import populate

    ids = populate(pop, workload)
    other = pop.start_run(workload, {}, "random")   # a second run's work is not counted
    cand = make_candidate(pop, workload, "elsewhere", run_id=other)
    ev = pop.begin_stage(cand, "check", run_id=other)
    assert ev is not None
    # the first run lasted ten minutes
    with pop.db.write() as s:
        s.execute(update(RunModel).where(RunModel.id == ids["run"]).values(
            started_at=utcnow() - timedelta(minutes=10), heartbeat_at=utcnow()))
    run = next(r for r in pop.runs(workload) if r.id == ids["run"])
    tp = pop.run_throughputs([run])[run.id]
    assert (tp.stages, tp.benched) == (10, 3)
    assert abs(tp.lease_held_s - 2.7) < 1e-9
    assert abs(tp.wall_s - 600) < 5 and abs(tp.benched_per_hour - 18) < 0.2
    running = next(r for r in pop.runs(workload) if r.id == other)
    assert pop.run_throughputs([running])[running.id].stages == 0   # its one stage is still running


def test_a_dead_run_ends_at_its_last_heartbeat_and_its_interrupted_stages_do_not_count(
        pop: Population, workload: int) -> None:
    run_id = pop.start_run(workload, {}, "evolution")
    cand = make_candidate(pop, workload, "lost", run_id=run_id)
    ev = pop.begin_stage(cand, "bench", run_id=run_id)
    assert ev is not None
    last_beat = utcnow() - timedelta(days=2)
    with pop.db.write() as s:   # the process died two days ago, ten minutes into the run
        s.execute(update(RunModel).where(RunModel.id == run_id).values(
            started_at=last_beat - timedelta(minutes=10), heartbeat_at=last_beat))
    assert pop.mark_interrupted(ev, "interrupted: run died")
    assert pop.finish_run(run_id, "interrupted", dead=True)
    run = pop.run(run_id)
    assert run is not None and run.state == "interrupted"
    tp = pop.run_throughputs([run])[run.id]
    assert abs(tp.wall_s - 600) < 1          # not two days
    assert (tp.stages, tp.benched) == (0, 0)  # the interrupted bench is no verdict


def test_a_screened_bench_is_a_finished_stage_but_no_candidate_benched(pop: Population, workload: int) -> None:
    run_id = pop.start_run(workload, {}, "auto")
    ran, skipped = (make_candidate(pop, workload, name, run_id=run_id) for name in ("ran", "skipped"))
    for cid, result in ((ran, StageResult(status="passed", ms=1.0, speedup=1.0)),
                        (skipped, StageResult(status="failed", failure_kind="screened", message="bench skipped"))):
        ev = pop.begin_stage(cid, "bench", run_id=run_id)
        assert ev is not None and pop.finish_stage(ev, result)
    run = pop.run(run_id)
    assert run is not None
    tp = pop.run_throughputs([run])[run.id]
    assert (tp.stages, tp.benched) == (2, 1)


def test_what_a_candidate_printed_is_recorded_on_every_backend(pop: Population, workload: int) -> None:
    # PostgreSQL refused a NUL in a message and NaN in the metrics (both printed by a
    # candidate): the row stayed `running` and every --resume ran the stage again.
    cid = make_candidate(pop, workload, "nul-nan")
    eid = finish(pop, cid, "gputest", StageResult(
        status="failed", failure_kind="correctness", message="bad\x00byte",
        metrics={"regimes": {"zz\x00": float("nan"), "ok": 0.0}, "inf": float("inf"), "big": [float("-inf")]}))
    (e,) = [e for e in pop.evaluations(cid) if e.id == eid]
    assert e.status == "failed" and e.message == "bad\\x00byte"
    assert e.metrics == {"regimes": {"zz\\x00": None, "ok": 0.0}, "inf": None, "big": [None]}


def test_metrics_too_large_for_a_row_keep_their_scalars(pop: Population, workload: int) -> None:
    cid = make_candidate(pop, workload, "huge-metrics")
    eid = finish(pop, cid, "iket", StageResult(status="passed", metrics={"span_us": 1.5, "keys": ["k" * 64] * 40000}))
    (e,) = [e for e in pop.evaluations(cid) if e.id == eid]
    assert e.metrics["span_us"] == 1.5 and "keys" not in e.metrics and "metrics_cut" in e.metrics

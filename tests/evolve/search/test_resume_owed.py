"""What `--resume` owes, read from a real migrated SQLite population whose rows are written
through `Population` as runs would write them: the cases the end-to-end resume tests
(test_resume.py) cannot stage in a reasonable time. No server: `_resume_jobs` only reads and
marks the database."""
from __future__ import annotations

import io

import pytest

from evolve.config import load_config
from evolve.loop import SERVER_RETRIES, SearchLoop
from evolve.population import NewCandidate, Population, StageResult
from evolve.vocabulary import EvaluationStatus, RunState, Stage
from tests.evolve.search.helpers import WORKLOAD, population, write_config

STAGES = [Stage.CHECK, Stage.GPUTEST, Stage.BENCH]


@pytest.fixture()
def setup(tmp_path):
    pop = population(f"sqlite:///{tmp_path / 'evolve.db'}")
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    loop = SearchLoop(load_config(write_config(tmp_path)), client=None, pop=pop)  # type: ignore[arg-type]
    return pop, wid, loop


def _run(pop: Population, wid: int) -> int:
    rid = pop.start_run(wid, {}, "evolution")
    pop.finish_run(rid, RunState.FAILED)
    return rid


def _candidate(pop: Population, wid: int, name: str) -> int:
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=name, directory=f"/x/{name}",
                                             name=name))
    return cand.id


def _stage(pop: Population, cid: int, stage: Stage, rid: int, *, kind: str | None = None,
           speedup: float | None = None, retry_of: int | None = None) -> int:
    eid = pop.begin_stage(cid, stage, run_id=rid, retry_of=retry_of)
    assert eid is not None
    status = EvaluationStatus.FAILED if kind else EvaluationStatus.PASSED
    pop.finish_stage(eid, StageResult(status=status, failure_kind=kind, speedup=speedup,
                                      ms=None if speedup is None else 1.0 / speedup))
    return eid


def _passes_to_bench(pop: Population, cid: int, rid: int) -> None:
    _stage(pop, cid, Stage.CHECK, rid)
    _stage(pop, cid, Stage.GPUTEST, rid)


def _bench_lost(pop: Population, wid: int, kind: str) -> tuple[int, int, int]:
    """(run, candidate, its bench evaluation): a run that lost a candidate's bench to the server."""
    rid = _run(pop, wid)
    cid = _candidate(pop, wid, "lost")
    _passes_to_bench(pop, cid, rid)
    return rid, cid, _stage(pop, cid, Stage.BENCH, rid, kind=kind)


def test_a_server_loss_is_owed_by_every_resume_until_retried(setup):
    """Run 1's breaker stopped it on a broken server; run 2 (its resume) stopped too before it
    reached the retry. Run 3 must still owe it: tied to run 2 alone, it was lost for good."""
    pop, wid, loop = setup
    _, cid, lost = _bench_lost(pop, wid, "unavailable")
    r2 = _run(pop, wid)
    judged = _candidate(pop, wid, "judged")          # a verdict, not a loss: never owed
    _passes_to_bench(pop, judged, r2)
    _stage(pop, judged, Stage.BENCH, r2, kind="runtime")
    jobs, retried = loop._resume_jobs(pop.run(r2), STAGES)
    assert [(j.candidate_id, j.retry_of) for j in jobs] == [(cid, {Stage.BENCH: lost})]
    assert retried == [lost]


def test_a_retry_that_passed_leaves_its_candidate_owed_a_promotion(setup):
    """The bench lost to the server in run 1 passed on retry in run 2, which died before
    promotion: the old failure must not make run 3 skip the candidate."""
    pop, wid, loop = setup
    _, cid, lost = _bench_lost(pop, wid, "transport")
    r2 = _run(pop, wid)
    _stage(pop, cid, Stage.BENCH, r2, speedup=1.4, retry_of=lost)
    jobs, retried = loop._resume_jobs(pop.run(r2), STAGES)
    assert [(j.candidate_id, j.retry_of) for j in jobs] == [(cid, {})]
    assert retried == []


def test_a_confirmation_lost_to_the_server_is_owed_while_it_could_promote(setup):
    pop, wid, loop = setup
    r1 = _run(pop, wid)
    best = _candidate(pop, wid, "best")
    _passes_to_bench(pop, best, r1)
    _stage(pop, best, Stage.BENCH, r1, speedup=1.2)
    confirmed = _stage(pop, best, Stage.CONFIRM, r1, speedup=1.2)
    assert pop.promote(best, None, [confirmed], None, None) is not None
    faster = _candidate(pop, wid, "faster")
    _passes_to_bench(pop, faster, r1)
    _stage(pop, faster, Stage.BENCH, r1, speedup=1.5)
    lost = _stage(pop, faster, Stage.CONFIRM, r1, kind="unavailable")
    slower = _candidate(pop, wid, "slower")           # its bench no longer beats the best
    _passes_to_bench(pop, slower, r1)
    _stage(pop, slower, Stage.BENCH, r1, speedup=1.1)
    _stage(pop, slower, Stage.CONFIRM, r1, kind="unavailable")
    jobs, retried = loop._resume_jobs(pop.run(r1), STAGES)
    assert [(j.candidate_id, j.retry_of) for j in jobs] == [(faster, {Stage.CONFIRM: lost})]
    assert retried == [lost]


def test_a_stage_the_server_keeps_losing_is_owed_only_so_often(setup):
    """A candidate that takes the server down whenever it runs would open every resume."""
    pop, wid, loop = setup
    r1, cid, lost = _bench_lost(pop, wid, "transport")
    for _ in range(SERVER_RETRIES):
        jobs, _ = loop._resume_jobs(pop.run(r1), STAGES)
        assert [(j.candidate_id, j.retry_of) for j in jobs] == [(cid, {Stage.BENCH: lost})]
        lost = _stage(pop, cid, Stage.BENCH, _run(pop, wid), kind="transport", retry_of=lost)
    assert loop._resume_jobs(pop.run(r1), STAGES) == ([], [])


def test_a_loss_outside_the_configured_families_is_left_owed(setup):
    pop, wid, loop = setup
    r1 = _run(pop, wid)
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", digest="other", directory="/x/o",
                                             family="two_pass", params={"chunk": 64}))
    _passes_to_bench(pop, cand.id, r1)
    _stage(pop, cand.id, Stage.BENCH, r1, kind="unavailable")
    assert loop._resume_jobs(pop.run(r1), STAGES) == ([], [])   # this config searches numpy_chunked only


def test_a_resume_says_where_its_config_differs_from_the_runs(tmp_path):
    pop = population(f"sqlite:///{tmp_path / 'evolve.db'}")
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    config = load_config(write_config(tmp_path), ["stages.gputest.enabled=false"])
    rid = pop.start_run(wid, config.to_record() | {"resumed_from": None}, "evolution")
    pop.finish_run(rid, RunState.FAILED)
    stream = io.StringIO()
    again = load_config(write_config(tmp_path), ["budget.max_evals=1"])   # the budget is a resume's own
    loop = SearchLoop(again, client=None, pop=pop, resume=True, stream=stream)  # type: ignore[arg-type]
    prev, _, _ = loop._resume_previous(wid, again.enabled_stages())
    assert prev is not None and prev.id == rid
    assert f"differs from run {rid}'s in stages.gputest.enabled " in stream.getvalue()
    stream.truncate(0)
    same = SearchLoop(config, client=None, pop=pop, resume=True, stream=stream)  # type: ignore[arg-type]
    same._resume_previous(wid, config.enabled_stages())
    assert "differs" not in stream.getvalue()

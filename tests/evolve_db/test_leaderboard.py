from __future__ import annotations

import json

from sqlalchemy import update

from evolve.db.models import CandidateModel
from evolve.leaderboard import format_table, to_json
from evolve.population import Population, StageResult

from .conftest import finish, make_candidate, populate


def test_ranked_by_best_passed_bench_with_confirmed_marks(pop: Population, workload: int) -> None:
    ids = populate(pop, workload)
    rows = pop.leaderboard(workload)
    assert [r.candidate_id for r in rows] == [ids["fast"], ids["slow"], ids["seed"]]
    assert [r.rank for r in rows] == [1, 2, 3]
    fast, slow, seed = rows
    assert fast.confirmed and fast.best and fast.excessive_sectors == 6144 and fast.ms == 0.667
    assert seed.confirmed and not seed.best  # promoted once, since overtaken
    assert not slow.confirmed and slow.source == "agent-7"
    assert fast.source == "two_pass" and seed.source == "seed"
    assert ids["broken"] not in {r.candidate_id for r in rows}  # never passed the bench


def test_failed_and_running_benches_do_not_rank(pop: Population, workload: int) -> None:
    a = make_candidate(pop, workload, "a")
    b = make_candidate(pop, workload, "b")
    c = make_candidate(pop, workload, "c")
    finish(pop, a, "bench", StageResult(status="failed", failure_kind="timeout", speedup=9.0))
    assert pop.begin_stage(b, "bench") is not None  # running, no speedup yet
    finish(pop, c, "gputest", StageResult(status="passed", speedup=50.0))  # not the ranked stage
    assert pop.leaderboard(workload) == []


def test_limit_and_workload_filter(pop: Population, workload: int) -> None:
    other = pop.ensure_workload("other", "candidates/kda/other")
    for i in range(5):
        cid = make_candidate(pop, workload, f"w{i}")
        finish(pop, cid, "bench", StageResult(status="passed", speedup=1.0 + i))
    oc = make_candidate(pop, other, "o")
    finish(pop, oc, "bench", StageResult(status="passed", speedup=100.0))
    top = pop.leaderboard(workload, limit=2)
    assert [r.speedup for r in top] == [5.0, 4.0]
    assert pop.leaderboard(None, limit=1)[0].candidate_id == oc
    assert len(pop.leaderboard(workload, limit=0)) == 5


def test_ties_keep_the_older_candidate_first(pop: Population, workload: int) -> None:
    first = make_candidate(pop, workload, "t1")
    second = make_candidate(pop, workload, "t2")
    finish(pop, second, "bench", StageResult(status="passed", speedup=2.0))
    finish(pop, first, "bench", StageResult(status="passed", speedup=2.0))
    assert [r.candidate_id for r in pop.leaderboard(workload)] == [first, second]


def test_text_and_json_output(pop: Population, workload: int) -> None:
    populate(pop, workload)
    rows = pop.leaderboard(workload)
    text = format_table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["rank", "id", "name"]
    assert "✓ best" in lines[2] and "3.000x" in lines[2] and "6,144" in lines[2]
    doc = json.loads(to_json(rows))
    assert doc[0]["confirmed"] is True and doc[0]["speedup"] == 3.0


def test_best_speedup_column_follows_finish_stage_and_can_be_rebuilt(pop: Population, workload: int) -> None:
    ids = populate(pop, workload)
    assert pop.candidate(ids["fast"]).best_speedup == 3.0  # type: ignore[union-attr]
    assert pop.candidate(ids["broken"]).best_speedup is None  # type: ignore[union-attr]
    # confirm passes carry a speedup too, but only bench ranks
    assert pop.candidate(ids["seed"]).best_speedup == 1.0  # type: ignore[union-attr]
    before = pop.leaderboard(workload)
    with pop.db.write() as s:
        s.execute(update(CandidateModel).values(best_speedup=None))
    assert pop.leaderboard(workload) == []
    pop.recompute_best_speedups()
    assert pop.leaderboard(workload) == before

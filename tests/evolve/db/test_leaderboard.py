from __future__ import annotations

import json

from sqlalchemy import update

from evolve.db.models import CandidateModel
from evolve.leaderboard_view import format_table, to_json
from evolve.population import Population, StageResult

from .conftest import finish, make_candidate, populate


def test_ranked_by_best_passed_bench_with_confirmed_marks(pop: Population, workload: int) -> None:
    ids = populate(pop, workload)
    rows = pop.leaderboard(workload)
    # confirmed first (the 1.0x seed was promoted once), then the unconfirmed 1.5x
    assert [r.candidate_id for r in rows] == [ids["fast"], ids["seed"], ids["slow"]]
    assert [r.rank for r in rows] == [1, 2, 3]
    fast, seed, slow = rows
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
    other = pop.ensure_workload("other", "kcoral/workloads/kda/other")
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


def _issue_case(pop: Population, workload: int) -> tuple[int, int]:
    """The issue's morning: a steady promoted 1.2x, and a 1.51x whose confirmation showed a
    13.7 % gain inside a 71.7 % spread (not promoted)."""
    steady = make_candidate(pop, workload, "steady")
    finish(pop, steady, "bench", StageResult(status="passed", ms=1.0, baseline_ms=1.2, speedup=1.2, spread=0.02))
    c = finish(pop, steady, "confirm", StageResult(status="passed", speedup=1.19, spread=0.03))
    pop.promote(steady, None, [c], margin=0.02, speedup_over_best=None)
    lucky = make_candidate(pop, workload, "lucky")
    finish(pop, lucky, "bench", StageResult(status="passed", ms=0.8, baseline_ms=1.2, speedup=1.51, spread=0.05))
    finish(pop, lucky, "confirm", StageResult(status="passed", speedup=1.137, spread=0.717))
    return steady, lucky


def test_confirmed_entries_rank_above_unconfirmed_with_spread_and_noise(pop: Population, workload: int) -> None:
    steady, lucky = _issue_case(pop, workload)
    rows = pop.leaderboard(workload)
    assert [r.candidate_id for r in rows] == [steady, lucky]
    top, second = rows
    assert top.best and not top.noisy and top.spread == 0.03
    # its widest measured spread (the confirmation's) swallows its gain: flagged
    assert second.noisy and second.spread == 0.717 and not second.confirmed
    lines = format_table(rows).splitlines()
    assert "spread" in lines[0].split()
    assert "71.7%" in lines[3] and "noisy" in lines[3] and "noisy" not in lines[2]


def test_each_row_names_the_card_its_bench_ran_on(pop: Population, workload: int) -> None:
    # A speedup is a ratio to the baseline on one card (one kernel: 3.14x on an H100, 3.31x on
    # an H200): a population benched on two kinds of card says which figure came from which.
    h200 = make_candidate(pop, workload, "on_h200")
    h100 = make_candidate(pop, workload, "on_h100")
    old = make_candidate(pop, workload, "unrecorded")
    finish(pop, h200, "bench", StageResult(status="passed", speedup=3.31, metrics={"device": "NVIDIA H200"}))
    finish(pop, h100, "bench", StageResult(status="passed", speedup=3.14,
                                           metrics={"device": "NVIDIA H100 80GB HBM3"}))
    finish(pop, old, "bench", StageResult(status="passed", speedup=2.0))
    rows = pop.leaderboard(workload)
    assert [(r.candidate_id, r.device) for r in rows] == [(h200, "NVIDIA H200"), (h100, "NVIDIA H100 80GB HBM3"),
                                                          (old, None)]
    lines = format_table(rows).splitlines()
    assert "card" in lines[0].split() and "H100 80GB HBM3" in lines[3] and "NVIDIA" not in lines[3]
    assert json.loads(to_json(rows))[1]["device"] == "NVIDIA H100 80GB HBM3"

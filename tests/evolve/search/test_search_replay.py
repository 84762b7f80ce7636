"""The replay benchmark's parts and the model-based strategy, on real recorded landscapes.

`data/pnpoly-RTX3090-small.csv.gz` is 660 points (34 failing) of a real Kernel Tuner
landscape (benchmarks/landscapes/README.md): no fake objective. Runtime 5 s on a 2-core
machine, 12 s when it is loaded; most of it in the auto-vs-random test.
"""
from __future__ import annotations

import gzip
import itertools
import random
import statistics
from pathlib import Path

import pytest

from evolve.config import StrategyConfig
from evolve.families import load_family
from evolve.loop import search_state
from evolve.population import NewCandidate, Population, StageResult
from evolve.replay.landscape import LandscapeError, load_landscape
from evolve.replay.recorded import RecordedPoint, append_points, load_points, to_landscape
from evolve.replay.scoring import random_expected_best, random_median
from evolve.replay.simulate import replay
from evolve.strategies import ModelStrategy, point_key
from tests.evolve.search.conftest import NUMPY_FAMILY

SMALL = Path(__file__).parent / "data" / "pnpoly-RTX3090-small.csv.gz"


def test_random_median_is_exact():
    """Against every ordering of a small space: the least t with P(first good <= t) >= 1/2."""
    for total, good in [(6, 1), (6, 2), (7, 3), (5, 5)]:
        firsts = []
        for order in itertools.permutations(range(total)):
            firsts.append(next(i for i, p in enumerate(order, 1) if p < good))
        n = len(firsts)
        exact = min(t for t in range(1, total + 1) if sum(f <= t for f in firsts) * 2 >= n)
        assert random_median(total, good) == exact
    assert random_median(4092, 29) == 97


def test_random_expected_best_matches_enumeration():
    times = [3.0, 1.0, 2.0]
    total = 4                                  # one failing point
    for n in range(1, 5):
        bests = []
        for pick in itertools.combinations([1.0, 2.0, 3.0, None], n):
            ok = [t for t in pick if t is not None]
            bests.append(min(ok) if ok else None)
        if None in bests:
            continue                           # only failures drawn: not a time to average
        assert random_expected_best(total, times, n) == pytest.approx(statistics.fmean(bests))


def test_bad_landscape_files_are_refused_clearly(tmp_path):
    cases = {
        "header.csv": "a,b,time\n1,2,3\n",
        "both.csv": "a,ms,failure\n1,2.0,compile\n",
        "neither.csv": "a,ms,failure\n1,,\n",
        "twice.csv": "a,ms,failure\n1,2.0,\n1,3.0,\n",
        "negative.csv": "a,ms,failure\n1,-2.0,\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(LandscapeError, match=name):
            load_landscape(tmp_path / name)
    with pytest.raises(LandscapeError, match="no such"):
        load_landscape(tmp_path / "missing.csv.gz")


def test_landscape_family_admits_only_recorded_points():
    landscape = load_landscape(SMALL)
    family = landscape.family()
    assert len(landscape.points) == 660 and sum(1 for p in landscape.points if p.failure) == 34
    assert all(family.admits(p.params) for p in landscape.points)
    first = dict(landscape.points[0].params)
    assert not family.admits(first | {"tile_size": 3})
    rng = random.Random(0)
    assert all(family.admits(family.sample(rng)) for _ in range(50))


@pytest.mark.parametrize("kind", ["auto", "evolution", "random"])
def test_no_point_twice_and_only_admitted_points(kind):
    """Concurrency 3: every proposal is a new point (the replay raises on a point outside
    the space), so none is wasted on a duplicate."""
    landscape = load_landscape(SMALL)
    budget = 120 if kind == "auto" else 300
    trace = replay(landscape, StrategyConfig(kind=kind, seed=3, initial_points=4), budget=budget, concurrency=3)
    assert len(trace.times) == budget
    assert trace.proposals == len(trace.times)            # no proposal was a point already tried


def test_auto_reaches_the_optimum_in_fewer_evaluations_than_random():
    """Five fixed seeds, the exact optimum (1 of 660 points): random search's exact median
    is 331 evaluations; auto must need at most half of it (random search, run here with the
    same seeds, needs 328: the assertion fails for it). Auto is not yet the default
    (docs/evolve.md), so it is named here."""
    landscape = load_landscape(SMALL)
    optimum = landscape.optimum_ms
    exact = random_median(len(landscape.points), landscape.within(0.0))
    assert exact == 331
    default = "auto"
    counts = {}
    for kind in (default, "random"):
        runs = [replay(landscape, StrategyConfig(kind=kind, seed=s), budget=exact, stop_below_ms=optimum)
                for s in range(5)]
        counts[kind] = statistics.median(r.evals_to(optimum) or exact + 1 for r in runs)
    assert counts[default] <= exact / 2, counts
    assert counts[default] < counts["random"], counts


# ---- the model strategy over a real population -------------------------------------------
def _finish(pop: Population, cid: int, stage: str, ok: bool, speedup: float | None = None,
            kind: str = "correctness") -> None:
    eid = pop.begin_stage(cid, stage)
    assert eid is not None
    pop.finish_stage(eid, StageResult(status="passed", speedup=speedup, ms=1.0) if ok else
                     StageResult(status="failed", failure_kind=kind, message="wrong"))


def _populate(pop: Population, fam, wid: int, points, start: int = 0):
    """Results for `points` (a function of the point, so two databases agree): every 5th
    fails to compile, every 7th is incorrect, the rest pass with a speedup from the params."""
    correct, incorrect = set(), set()
    for i, point in enumerate(points, start=start):
        cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=fam.name,
                                                 params=point, digest=f"d{i}", directory=f"gen/d{i}"))
        if i % 5 == 0:
            _finish(pop, cand.id, "check", False, kind="compile")
            incorrect.add(cand.id)
        elif i % 7 == 0:
            _finish(pop, cand.id, "bench", False)
            incorrect.add(cand.id)
        else:
            _finish(pop, cand.id, "bench", True, speedup=1.0 + (hash(str(sorted(point.items()))) % 97) / 97)
            correct.add(cand.id)
    return correct, incorrect


def test_model_never_breeds_from_or_returns_to_a_failed_point_and_respects_constraints(pop):
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small")
    points = list(fam.points())
    random.Random(1).shuffle(points)
    correct, incorrect = _populate(pop, fam, wid, points[:24])
    tried = {point_key(c.family, c.params) for c in pop.candidates(wid)}
    state = search_state(pop, wid, set(tried), 0)
    assert {f.id for f in state.failed} == incorrect - {c for c in incorrect if pop.bench_speedup(c)} \
        and state.failed and all(f.kind in ("compile", "correctness") for f in state.failed)
    strategy = ModelStrategy({fam.name: fam}, StrategyConfig(initial_points=4))
    rng = random.Random(5)
    for i in range(15):
        prop = strategy.propose(state, rng)
        assert prop is not None
        assert fam.admits(prop.params)                 # the family's constraints hold
        assert prop.key not in state.tried             # never a point proposed or present
        assert set(prop.parents) <= correct            # bred, if at all, from correct ones only
        state.tried.add(prop.key)
        state.proposal_index = i + 1


def test_model_resumes_from_the_database_deterministically(tmp_path):
    """Two databases reach the same population by different processes (one run end to end;
    one closed and reopened mid-way): the next proposals are the same."""
    fam = load_family(NUMPY_FAMILY)
    points = list(fam.points())
    random.Random(2).shuffle(points)

    def proposals_after(url: str, reopen: bool) -> list:
        pop = Population.open(url)
        wid = pop.ensure_workload("w", "w")
        _populate(pop, fam, wid, points[:10])
        if reopen:
            pop.close()
            pop = Population.open(url)
        _populate(pop, fam, wid, points[10:20], start=10)
        tried = {point_key(f, p) for f, p in pop.family_points(wid)}
        state = search_state(pop, wid, tried, 20)
        strategy = ModelStrategy({fam.name: fam}, StrategyConfig(seed=9))
        rng = random.Random("9:2")
        out = []
        for _ in range(5):
            prop = strategy.propose(state, rng)
            out.append(prop.key)
            state.tried.add(prop.key)
        pop.close()
        return out

    a = proposals_after(f"sqlite:///{tmp_path / 'a.db'}", reopen=False)
    b = proposals_after(f"sqlite:///{tmp_path / 'b.db'}", reopen=True)
    assert a == b and len(set(a)) == 5


# ---- our own recorded points --------------------------------------------------------------
def test_recorded_points_append_and_become_a_landscape(tmp_path):
    path = tmp_path / "points.csv"
    pts = [RecordedPoint(family="f", params={"a": a, "b": b}, ms=1.0 + a + b if (a, b) != (2, 1) else None,
                         failure="compile" if (a, b) == (2, 1) else None, date="2026-12-03", commit="abc")
           for a in (1, 2) for b in (1, 2)]
    append_points(path, pts[:2])
    append_points(path, pts[2:] + [RecordedPoint(family="g", params={}, ms=3.0, date="2026-12-03", commit="abc")])
    loaded = load_points(path)
    assert loaded == pts + [loaded[-1]]
    landscape = to_landscape(loaded, "f")
    assert len(landscape.points) == 4 and landscape.optimum_ms == 3.0
    with pytest.raises(ValueError, match="exactly one"):
        RecordedPoint(family="f", params={}, date="2026-12-03", commit="abc")
    path.write_text("family,params\n")
    with pytest.raises(LandscapeError, match="header"):
        load_points(path)


def test_shipped_landscapes_load():
    shipped = sorted((Path(__file__).parents[3] / "benchmarks" / "landscapes").glob("*.csv.gz"))
    assert len(shipped) == 6
    for path in shipped:
        with gzip.open(path, "rt") as fh:
            assert "licence: MIT" in fh.read(2000)


# ---- the two scripts, as a user runs them -------------------------------------------------
REPO = Path(__file__).resolve().parents[3]


def _script(*args: str, cwd: Path):
    import subprocess
    import sys
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_replay_script_json_plot_and_bad_input(tmp_path):
    plot = tmp_path / "r.svg"
    proc = _script(str(REPO / "benchmarks" / "search_replay.py"), str(SMALL), "--strategies", "evolution,random",
                   "--seeds", "2", "--budget", "100", "--jobs", "1", "--plot", str(plot), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json
    report = json.loads(proc.stdout)
    entry = report["landscapes"][0]
    assert entry["points"] == 660 and entry["random_exact_median"] == random_median(660, entry["good"])
    assert set(entry["strategies"]) == {"evolution", "random"}
    assert all(len(s["evals"]) == 2 for s in entry["strategies"].values())
    assert plot.read_text().startswith("<svg") and "polyline" in plot.read_text()
    bad = _script(str(REPO / "benchmarks" / "search_replay.py"), str(SMALL), "--strategies", "annealing", cwd=tmp_path)
    assert bad.returncode == 2 and "annealing" in bad.stderr
    (tmp_path / "broken.csv").write_text("a,ms,failure\n1,,\n")
    bad = _script(str(REPO / "benchmarks" / "search_replay.py"), str(tmp_path / "broken.csv"), cwd=tmp_path)
    assert bad.returncode == 2 and "exactly one of a time and a failure" in bad.stderr


def test_record_point_from_a_real_database(tmp_path, pop):
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small")
    points = list(fam.points())[:3]
    ids = []
    for i, point in enumerate(points):
        cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=fam.name,
                                                 params=point, digest=f"r{i}", directory=f"gen/r{i}"))
        ids.append(cand.id)
    _finish(pop, ids[0], "bench", True, speedup=2.0)          # ms=1.0 (the helper's)
    _finish(pop, ids[1], "bench", False, kind="runtime")
    # ids[2]: benched on another kind of card, not an H200 point
    eid = pop.begin_stage(ids[2], "bench")
    assert eid is not None
    pop.finish_stage(eid, StageResult(status="passed", speedup=3.1, ms=1.03,
                                      metrics={"device": "NVIDIA H100 80GB HBM3"}))
    db_url = str(pop.db.engine.url)
    out = tmp_path / "points.csv"
    proc = _script(str(REPO / "benchmarks" / "record_point.py"), "--from-db", db_url, "--commit", "abc1234",
                   "--file", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = load_points(out)
    assert [(p.params, p.ms, p.failure) for p in got] == [(points[0], 1.0, None), (points[1], None, "runtime")]
    assert all(p.family == fam.name and p.commit == "abc1234" for p in got)
    assert "left out 1 bench(es) run on NVIDIA H100 80GB HBM3" in proc.stderr
    every = tmp_path / "every.csv"
    proc = _script(str(REPO / "benchmarks" / "record_point.py"), "--from-db", db_url, "--commit", "abc1234",
                   "--file", str(every), "--device", "", cwd=tmp_path)
    assert proc.returncode == 0 and [p.ms for p in load_points(every)] == [1.0, None, 1.03]
    bad = _script(str(REPO / "benchmarks" / "record_point.py"), "f", "[1]", "--ms", "1", "--commit", "c",
                  "--file", str(out), cwd=tmp_path)
    assert bad.returncode == 2 and "JSON object" in bad.stderr
    assert len(load_points(out)) == 2                          # nothing appended by the bad call

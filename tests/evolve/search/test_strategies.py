"""Strategies over a real SQLite population: parents are only ever correct candidates."""
from __future__ import annotations

import random

import pytest

from evolve.config import StrategyConfig
from evolve.families import load_family
from evolve.population import NewCandidate, Population, StageResult
from evolve.strategies import (EvolutionStrategy, ExhaustiveStrategy, Parent, RandomStrategy, SearchState,
                               point_key)
from tests.evolve.search.conftest import NUMPY_FAMILY


def _finish(pop: Population, cid: int, stage: str, ok: bool, speedup: float | None = None) -> None:
    eid = pop.begin_stage(cid, stage)
    assert eid is not None
    pop.finish_stage(eid, StageResult(status="passed", speedup=speedup, ms=1.0) if ok else
                     StageResult(status="failed", failure_kind="correctness", message="wrong"))


@pytest.fixture
def populated(pop: Population):
    """A population with correct, bench-failed, check-failed and unfinished candidates."""
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small")
    rng = random.Random(42)
    points = list(fam.points())
    rng.shuffle(points)
    correct, incorrect = set(), set()
    for i, point in enumerate(points[:40]):
        cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=fam.name,
                                                 params=point, digest=f"d{i}", directory=f"gen/d{i}"))
        _finish(pop, cand.id, "check", i % 7 != 0)
        if i % 7 == 0:
            incorrect.add(cand.id)           # failed its check
        elif i % 3 == 0:
            _finish(pop, cand.id, "bench", False)
            incorrect.add(cand.id)           # failed its bench
        elif i % 5 == 0:
            assert pop.begin_stage(cand.id, "bench") is not None
            incorrect.add(cand.id)           # its bench is still running: not known correct
        else:
            _finish(pop, cand.id, "bench", True, speedup=1.0 + rng.random())
            correct.add(cand.id)
    # A fast, correct agent candidate outside every family: it must never breed either.
    agent, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest="agent",
                                              directory="scratch/a"))
    _finish(pop, agent.id, "bench", True, speedup=50.0)
    return fam, wid, correct, incorrect, agent.id


def _state(pop, wid, tried=frozenset(), index=0):
    return SearchState(correct=[Parent(id=c.id, family=c.family, params=c.params, speedup=s, generation=c.generation)
                                for c, s in pop.correct(wid)], tried=set(tried), proposal_index=index)


def test_evolution_never_picks_an_incorrect_parent(pop, populated):
    fam, wid, correct, incorrect, agent_id = populated
    state = _state(pop, wid, tried={point_key(fam.name, fam.defaults)})
    assert {p.id for p in state.correct} == correct | {agent_id}
    ops = set()
    for seed in range(300):
        cfg = StrategyConfig(seed=seed, islands=1 + seed % 3, crossover_rate=0.5, immigrant_share=0.1,
                             population_size=1 + seed % 20, tournament_size=1 + seed % 4)
        strategy = EvolutionStrategy({fam.name: fam}, cfg)
        rng = random.Random(seed)
        for i in range(5):
            state.proposal_index = i
            prop = strategy.propose(state, rng)
            assert prop is not None
            ops.add(prop.operator)
            assert set(prop.parents) <= correct, (seed, prop)
            assert not set(prop.parents) & (incorrect | {agent_id})
            assert fam.admits(prop.params)
            if prop.parents:
                assert prop.generation >= 1
    assert {"mutate", "crossover", "immigrant"} <= ops


def test_seeds_come_first_then_offspring_differ_from_parents(pop, populated):
    fam, wid, correct, *_ = populated
    strategy = EvolutionStrategy({fam.name: fam}, StrategyConfig(immigrant_share=0.0, crossover_rate=0.0))
    first = strategy.propose(_state(pop, wid), random.Random(0))
    assert first.operator == "seed" and first.params == fam.defaults
    state = _state(pop, wid, tried={first.key})
    by_id = {p.id: p for p in state.correct}
    for seed in range(50):
        prop = strategy.propose(state, random.Random(seed))
        assert prop.operator == "mutate"
        assert prop.params != by_id[prop.parents[0]].params


def test_without_correct_candidates_evolution_explores(pop):
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("w", "w")
    strategy = EvolutionStrategy({fam.name: fam}, StrategyConfig())
    state = _state(pop, wid, tried={point_key(fam.name, fam.defaults)})
    prop = strategy.propose(state, random.Random(1))
    assert prop.operator == "immigrant" and prop.parents == []


def test_proposals_are_reproducible_for_a_seed(pop, populated):
    fam, wid, *_ = populated
    state = _state(pop, wid, tried={point_key(fam.name, fam.defaults)})
    strategy = EvolutionStrategy({fam.name: fam}, StrategyConfig(crossover_rate=0.5))
    a = [strategy.propose(state, r) for r in [random.Random(7)] for _ in range(10)]
    b = [strategy.propose(state, r) for r in [random.Random(7)] for _ in range(10)]
    assert a == b


def test_exhaustive_walks_every_point_once_then_stops():
    fam = load_family(NUMPY_FAMILY).restrict(fixed={"algorithm": "chunked", "dtype": "float64", "solve": "linalg"})
    strategy = ExhaustiveStrategy({fam.name: fam})
    state = SearchState()
    seen = []
    while (prop := strategy.propose(state, random.Random(0))) is not None:
        seen.append(prop.key)
        state.tried.add(prop.key)
    assert len(seen) == len(set(seen)) == len(list(fam.points()))
    assert seen[0] == point_key(fam.name, fam.defaults)


def test_random_strategy_seeds_then_samples():
    fam = load_family(NUMPY_FAMILY)
    strategy = RandomStrategy({fam.name: fam})
    state = SearchState()
    assert strategy.propose(state, random.Random(0)).operator == "seed"
    state.tried.add(point_key(fam.name, fam.defaults))
    props = [strategy.propose(state, random.Random(i)) for i in range(20)]
    assert all(p.operator == "immigrant" and fam.admits(p.params) for p in props)
    assert len({p.key for p in props}) > 5


def test_auto_gives_evolution_every_second_proposal_once_the_search_stalls():
    from evolve.strategies.auto import STALL, AutoStrategy, stalled

    fam = load_family(NUMPY_FAMILY)
    points = list(fam.points())

    def state(best_id: int, newest_id: int, index: int) -> SearchState:
        # the best candidate is `best_id`; every other id up to `newest_id` is slower
        correct = [Parent(id=best_id, family=fam.name, params=points[0], speedup=2.0)]
        correct += [Parent(id=i, family=fam.name, params=points[i % len(points)], speedup=1.0)
                    for i in range(1, newest_id + 1) if i != best_id]
        return SearchState(correct=correct, proposal_index=index)

    assert not stalled(state(best_id=10, newest_id=10 + STALL - 1, index=0))
    assert stalled(state(best_id=10, newest_id=10 + STALL, index=0))
    auto = AutoStrategy({fam.name: fam}, StrategyConfig(seed=1))
    calls: list[str] = []
    for name in ("model", "evolution"):
        inner = getattr(auto, name)
        real = inner.propose
        inner.propose = lambda st, rng, _real=real, _name=name: (calls.append(_name), _real(st, rng))[1]
    whose = {}
    for label, best, newest in (("fresh", 30, 31), ("stalled", 3, 3 + STALL + 5)):
        whose[label] = []
        for index in range(6):
            calls.clear()
            auto.propose(state(best, newest, index), random.Random(index))
            whose[label].append(calls[0])
    assert [i for i, w in enumerate(whose["fresh"]) if w == "evolution"] == [2, 5]        # every third
    assert [i for i, w in enumerate(whose["stalled"]) if w == "evolution"] == [1, 3, 5]   # every second


def test_model_with_a_family_known_by_one_candidate_and_a_failure():
    """The second family has one correct candidate and one failed point: the model scores
    it from the prior of all observations and its failure model still discounts the point
    next to the failure; in either order of the state's correct list the proposals agree."""
    from evolve.strategies.base import Failed
    from evolve.strategies.model import ModelStrategy

    fam = load_family(NUMPY_FAMILY)
    points = list(fam.points())
    random.Random(0).shuffle(points)
    correct = [Parent(id=i + 1, family="a", params=points[i], speedup=1 + i / 10) for i in range(12)]
    correct.append(Parent(id=50, family="b", params=points[20], speedup=1.5))
    failed = [Failed(id=60, family="b", params=points[21], kind="compile")]
    tried = {point_key(p.family or "", p.params) for p in correct} | {point_key("b", points[21])} | \
        {point_key(name, fam.defaults) for name in ("a", "b")}
    runs = []
    for order in (correct, sorted(correct, key=lambda p: (-p.speedup, p.id))):
        strategy = ModelStrategy({"a": fam, "b": fam}, StrategyConfig(seed=1, initial_points=2))
        seen, keys = set(tried), []
        for i in range(3):
            prop = strategy.propose(SearchState(correct=list(order), failed=failed, tried=seen, proposal_index=i),
                                    random.Random(i))
            assert prop is not None and prop.key not in seen and fam.admits(prop.params)
            seen.add(prop.key)
            keys.append(prop.key)
        runs.append(keys)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("family", ["numpy_chunked", "fused", "fused_tiles"])
def test_a_space_held_as_codes_gives_back_every_point_and_refuses_strangers(family):
    """Each admitted point is one integer in the model's space: decoding gives the walk's
    point, and a key finds its own row and no other; a point the space lacks (a value the
    family does not list, a parameter too many or too few) has no row."""
    from evolve.families import canonical_params
    from evolve.strategies.model import _Space

    fam = load_family(NUMPY_FAMILY.parent / family)
    space = _Space(fam)
    walked = list(fam.points())
    from evolve.strategies.model import ENUMERATE_LIMIT
    # a family past the limit is searched by rejection samples, seconds a proposal: prune its
    # space (values measured slower) or raise the limit knowingly
    assert space.enumerated, f"{family} admits {len(walked)} points, past the model's ENUMERATE_LIMIT of {ENUMERATE_LIMIT}"
    assert space.size == len(walked)
    assert [space.point(i) for i in range(space.size)] == walked
    assert [space.row(canonical_params(p)) for p in walked] == list(range(len(walked)))
    p = dict(walked[-1])
    name = next(iter(p))
    assert space.row(canonical_params({**p, name: "no such value"})) is None
    assert space.row(canonical_params({**p, "no_such_parameter": 1})) is None
    assert space.row(canonical_params({k: v for k, v in p.items() if k != name})) is None


def test_the_model_scores_two_pass_from_its_admitted_points_not_rejection_samples():
    """two_pass admits 2 % of its 500,000 combinations: drawing the model's candidates by
    rejection sampling cost seconds per proposal (search_overhead.py --family). The space is
    walked once instead, and each proposal is an untried admitted point."""
    from evolve.families import canonical_params
    from evolve.strategies.model import ModelStrategy, _Space

    fam = load_family(NUMPY_FAMILY.parent / "two_pass")
    space = _Space(fam)
    assert fam.size_upper_bound() > 50_000 and space.enumerated
    walked = list(fam.points())
    assert space.size == len(walked)
    points = [space.point(i) for i in range(space.size)]
    assert points == walked                                   # the codes give the points back
    assert all(space.row(canonical_params(p)) == i for i, p in enumerate(points[:500]))
    random.Random(1).shuffle(points)
    correct = [Parent(id=i + 1, family="two_pass", params=points[i], speedup=1 + i / 10) for i in range(8)]
    seen = {point_key("two_pass", p.params) for p in correct} | {point_key("two_pass", fam.defaults)}
    strategy = ModelStrategy({"two_pass": fam}, StrategyConfig(seed=1, initial_points=2))
    for i in range(3):
        prop = strategy.propose(SearchState(correct=correct, failed=[], tried=seen, proposal_index=i),
                                random.Random(i))
        assert prop is not None and prop.key not in seen and fam.admits(prop.params)
        seen.add(prop.key)

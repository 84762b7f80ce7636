"""Evolutionary search: tournament selection among correct candidates, mutation,
crossover, random immigrants, optional islands.

Parents are drawn only from `SearchState.correct` (candidates whose latest bench passed)
and only from the configured families' spaces, so an incorrect or foreign candidate can
never breed.
"""
from __future__ import annotations

import random

from evolve.config import StrategyConfig
from evolve.families import Family, Value
from evolve.strategies.base import Parent, Proposal, SearchState, fastest_first, fresh_immigrant, untried_seed

_ATTEMPTS = 30


class EvolutionStrategy:
    def __init__(self, families: dict[str, Family], config: StrategyConfig):
        self.families = families
        self.config = config
        self._admits: dict[int, bool] = {}   # candidate id -> in a configured space (ids and params never change)

    def _admitted(self, p: Parent) -> bool:
        if p.id not in self._admits:
            self._admits[p.id] = p.family in self.families and self.families[p.family].admits(p.params)
        return self._admits[p.id]

    # ---- selection ---------------------------------------------------------------------
    def breeding_pool(self, state: SearchState) -> list[Parent]:
        """The best `population_size` correct candidates that lie in a configured space.
        A state that comes fastest first (checked on its columns) is read only until the
        pool is full, not all 10 000 candidates."""
        size = self.config.population_size
        if fastest_first(state.columns()):
            pool: list[Parent] = []
            for p in state.correct:
                if len(pool) == size:
                    break
                if self._admitted(p):
                    pool.append(p)
            return pool
        pool = [p for p in state.correct if self._admitted(p)]
        pool.sort(key=lambda p: (-p.speedup, p.id))
        return pool[:size]

    def _island(self, pool: list[Parent], state: SearchState, rng: random.Random) -> list[Parent]:
        islands = self.config.islands
        if islands <= 1 or rng.random() < self.config.migration_rate:
            return pool
        island = state.proposal_index % islands
        members = [p for p in pool if p.id % islands == island]
        return members or pool

    def _tournament(self, members: list[Parent], rng: random.Random) -> Parent:
        k = min(self.config.tournament_size, len(members))
        return max(rng.sample(members, k), key=lambda p: (p.speedup, -p.id))

    # ---- variation ---------------------------------------------------------------------
    def _mutate(self, family: Family, params: dict[str, Value], rng: random.Random) -> dict[str, Value]:
        child = dict(params)
        movable = [n for n, vals in family.parameters.items() if len(vals) > 1]
        if not movable:
            return child
        forced = rng.choice(movable)
        for name in movable:
            if name == forced or rng.random() < self.config.mutation_rate:
                child[name] = _neighbour(family.parameters[name], child[name], rng)
        return child

    @staticmethod
    def _crossover(a: dict[str, Value], b: dict[str, Value], rng: random.Random) -> dict[str, Value]:
        return {name: (a[name] if rng.random() < 0.5 else b[name]) for name in a}

    # ---- the proposal ------------------------------------------------------------------
    def propose(self, state: SearchState, rng: random.Random) -> Proposal | None:
        seed = untried_seed(self.families, state)
        if seed is not None:
            return seed
        pool = self.breeding_pool(state)
        if not pool or rng.random() < self.config.immigrant_share:
            return fresh_immigrant(self.families, state, rng)
        members = self._island(pool, state, rng)
        for _ in range(_ATTEMPTS):
            a = self._tournament(members, rng)
            family = self.families[a.family]  # type: ignore[index]
            mates = [p for p in members if p.family == a.family and p.id != a.id]
            if mates and rng.random() < self.config.crossover_rate:
                b = self._tournament(mates, rng)
                params = self._crossover(a.params, b.params, rng)
                if params in (a.params, b.params):
                    params = self._mutate(family, params, rng)
                proposal = Proposal(family=a.family, params=params, parents=[a.id, b.id],
                                    operator="crossover", generation=max(a.generation, b.generation) + 1)
            else:
                proposal = Proposal(family=a.family, params=self._mutate(family, a.params, rng),
                                    parents=[a.id], operator="mutate", generation=a.generation + 1)
            if not family.admits(proposal.params):
                continue
            if proposal.key not in state.tried:
                return proposal
        # The neighbourhood of the pool is used up: explore elsewhere (never a tried point).
        return fresh_immigrant(self.families, state, rng)


def _neighbour(values: list[Value], current: Value, rng: random.Random) -> Value:
    """Another allowed value; numeric lists prefer an adjacent step (a local move)."""
    others = [v for v in values if v != current]
    if not others:
        return current
    if current in values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) \
            and rng.random() < 0.7:
        ordered = sorted(values)
        i = ordered.index(current)
        adjacent = [ordered[j] for j in (i - 1, i + 1) if 0 <= j < len(ordered)]
        return rng.choice(adjacent)
    return rng.choice(others)

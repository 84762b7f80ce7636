"""What a search strategy sees and what it proposes.

Strategies keep no state of their own between proposals beyond a seeded RNG handed in by
the loop: everything they know comes from the population (`SearchState`), so a resumed
run continues from what the database holds.
"""
from __future__ import annotations

import random
from operator import attrgetter
from typing import Literal, NamedTuple, Protocol

import numpy as np
from pydantic import BaseModel, Field, PrivateAttr

from evolve.families import Family, Value, canonical_params

Operator = Literal["seed", "mutate", "crossover", "immigrant", "enumerate", "model"]


class Parent(BaseModel):
    """A correct candidate: its latest bench passed."""
    id: int
    family: str | None
    params: dict[str, Value]
    speedup: float
    generation: int = 0


class Failed(BaseModel):
    """A candidate of a family whose pipeline failed in a way the point itself causes
    (`evolve.vocabulary.INFEASIBLE_KINDS`): a model learns to avoid its neighbourhood; it
    never breeds."""
    id: int
    family: str
    params: dict[str, Value]
    kind: str


class Proposal(BaseModel):
    family: str
    params: dict[str, Value]
    parents: list[int] = Field(default_factory=list)
    operator: Operator
    generation: int = 0

    @property
    def key(self) -> tuple:
        return point_key(self.family, self.params)


class Columns(NamedTuple):
    """`SearchState.correct` as read-only arrays, in its order."""
    ids: np.ndarray        # int64
    speedups: np.ndarray   # float64
    families: np.ndarray   # object: str or None

    @classmethod
    def of(cls, parents: list[Parent]) -> Columns:
        columns = cls(np.fromiter(map(attrgetter("id"), parents), dtype=np.int64, count=len(parents)),
                      np.fromiter(map(attrgetter("speedup"), parents), dtype=float, count=len(parents)),
                      np.array(list(map(attrgetter("family"), parents)) or [], dtype=object))
        return columns.frozen()

    def frozen(self) -> Columns:
        for column in self:
            column.flags.writeable = False
        return self


def fastest_first(columns: Columns) -> bool:
    """Whether the candidates come in the order `SearchState.correct` promises."""
    ahead, behind = columns.speedups[:-1], columns.speedups[1:]
    return bool(np.all((ahead > behind) | ((ahead == behind) & (columns.ids[:-1] < columns.ids[1:]))))


class SearchState(BaseModel):
    """The population as a strategy sees it. `correct` is fastest first (ties: lower id
    first) wherever the loop or the replay builds it; strategies check rather than assume."""
    correct: list[Parent] = Field(default_factory=list)
    failed: list[Failed] = Field(default_factory=list)
    tried: set[tuple] = Field(default_factory=set)    # point_key of every point already proposed or present
    proposal_index: int = 0                           # proposals made so far by this run (islands rotate on it)
    _columns: Columns | None = PrivateAttr(default=None)

    def columns(self) -> Columns:
        """`correct` column by column: built once per state, or handed in by whoever keeps
        them up to date (`keep_columns`). At 10 000 candidates each pass over the objects
        cost milliseconds; a strategy reads arrays instead. `correct` must not change after."""
        if self._columns is None:
            self._columns = Columns.of(self.correct)
        return self._columns

    def keep_columns(self, columns: Columns) -> SearchState:
        self._columns = columns.frozen()
        return self


def point_key(family: str, params: dict) -> tuple:
    return (family, canonical_params(params))


class Strategy(Protocol):
    def propose(self, state: SearchState, rng: random.Random) -> Proposal | None:
        """The next point to evaluate, or None when the space is exhausted."""


def untried_seed(families: dict[str, Family], state: SearchState) -> Proposal | None:
    """Each family's defaults, once, before anything else."""
    for name, family in families.items():
        if point_key(name, family.defaults) not in state.tried:
            return Proposal(family=name, params=family.defaults, operator="seed", generation=0)
    return None


def immigrant(families: dict[str, Family], state: SearchState, rng: random.Random,
              attempts: int = 20) -> Proposal:
    """A random admitted point, preferring one not tried yet."""
    names = list(families)
    weights = [families[n].size_upper_bound() for n in names]
    proposal = None
    for _ in range(attempts):
        name = rng.choices(names, weights=weights)[0]
        proposal = Proposal(family=name, params=families[name].sample(rng), operator="immigrant")
        if proposal.key not in state.tried:
            return proposal
    assert proposal is not None
    return proposal


def fresh_immigrant(families: dict[str, Family], state: SearchState, rng: random.Random) -> Proposal | None:
    """A random admitted point not tried yet; when rejection sampling keeps hitting tried
    points (the space is nearly used up), the first untried point in order; None when none
    is left. No strategy proposes a point twice."""
    proposal = immigrant(families, state, rng)
    if proposal.key not in state.tried:
        return proposal
    for name, family in families.items():
        for point in family.points():
            if point_key(name, point) not in state.tried:
                return Proposal(family=name, params=point, operator="immigrant")
    return None

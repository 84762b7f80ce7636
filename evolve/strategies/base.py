"""What a search strategy sees and what it proposes.

Strategies keep no state of their own between proposals beyond a seeded RNG handed in by
the loop: everything they know comes from the population (`SearchState`), so a resumed
run continues from what the database holds.
"""
from __future__ import annotations

import random
from typing import Literal, Protocol

from pydantic import BaseModel, Field

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


class SearchState(BaseModel):
    """The population as a strategy sees it."""
    correct: list[Parent] = Field(default_factory=list)
    failed: list[Failed] = Field(default_factory=list)
    tried: set[tuple] = Field(default_factory=set)    # point_key of every point already proposed or present
    proposal_index: int = 0                           # proposals made so far by this run (islands rotate on it)


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

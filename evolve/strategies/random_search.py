"""Random search: the seeds, then uniformly drawn admitted points, none twice."""
from __future__ import annotations

import random

from evolve.families import Family
from evolve.strategies.base import Proposal, SearchState, fresh_immigrant, untried_seed


class RandomStrategy:
    def __init__(self, families: dict[str, Family]):
        self.families = families

    def propose(self, state: SearchState, rng: random.Random) -> Proposal | None:
        return untried_seed(self.families, state) or fresh_immigrant(self.families, state, rng)

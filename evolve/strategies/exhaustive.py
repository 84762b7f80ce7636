"""Exhaustive search: every admitted point of every family, defaults first, then in order."""
from __future__ import annotations

import random

from evolve.families import Family
from evolve.strategies.base import Proposal, SearchState, point_key


class ExhaustiveStrategy:
    def __init__(self, families: dict[str, Family]):
        self.families = families

    def propose(self, state: SearchState, rng: random.Random) -> Proposal | None:
        # Walks from the start each time, skipping tried points: no cursor to lose on resume.
        for name, family in self.families.items():
            for point in family.points():
                if point_key(name, point) not in state.tried:
                    op = "seed" if point == family.defaults else "enumerate"
                    return Proposal(family=name, params=point, operator=op)
        return None

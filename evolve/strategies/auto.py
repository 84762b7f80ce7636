"""The default strategy: the model-based proposer, with every third proposal bred by
evolution instead, and every second once the search has stalled.

Why the mix (the replay benchmark, docs/benchmarks.md): the surrogate alone was the best
strategy on four of six recorded landscapes and the worst on one whose optimum is an
isolated spike (every neighbour 20 % slower), where a smooth model keeps refining the
wrong basin; evolution's mutations find such spikes. When `STALL` candidates have come
in since the best one, the model is refining a basin that has stopped paying, and half
the proposals go to evolution. Which proposal is whose depends only on the `SearchState`
(`proposal_index`, candidate ids), so a resumed run stays deterministic.
"""
from __future__ import annotations

import random

from evolve.config import StrategyConfig
from evolve.families import Family
from evolve.strategies.base import Proposal, SearchState
from evolve.strategies.evolution import EvolutionStrategy
from evolve.strategies.model import ModelStrategy

EVOLUTION_EVERY = 3
STALLED_EVERY = 2
STALL = 25   # candidates with a result since the best one


def stalled(state: SearchState, after: int = STALL) -> bool:
    """Whether `after` candidates have a result newer than the best correct one."""
    if not state.correct:
        return False
    best = state.correct[0].id   # fastest first
    newer = int((state.columns().ids > best).sum()) + sum(1 for f in state.failed if f.id > best)
    return newer >= after


class AutoStrategy:
    def __init__(self, families: dict[str, Family], config: StrategyConfig):
        self.model = ModelStrategy(families, config)
        self.evolution = EvolutionStrategy(families, config)

    def propose(self, state: SearchState, rng: random.Random) -> Proposal | None:
        every = STALLED_EVERY if stalled(state) else EVOLUTION_EVERY
        if state.proposal_index % every == every - 1:
            proposal = self.evolution.propose(state, rng)
            if proposal is not None:
                return proposal
        return self.model.propose(state, rng)

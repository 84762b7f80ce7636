"""The default strategy: the model-based proposer, with every third proposal bred by
evolution instead.

Why the mix (the replay benchmark, docs/benchmarks.md): the surrogate alone was the best
strategy on four of six recorded landscapes and the worst on one whose optimum is an
isolated spike (every neighbour 20 % slower), where a smooth model keeps refining the
wrong basin; evolution's mutations find such spikes. Which proposal is whose depends only
on `SearchState.proposal_index`, so a resumed run stays deterministic.
"""
from __future__ import annotations

import random

from evolve.config import StrategyConfig
from evolve.families import Family
from evolve.strategies.base import Proposal, SearchState
from evolve.strategies.evolution import EvolutionStrategy
from evolve.strategies.model import ModelStrategy

EVOLUTION_EVERY = 3


class AutoStrategy:
    def __init__(self, families: dict[str, Family], config: StrategyConfig):
        self.model = ModelStrategy(families, config)
        self.evolution = EvolutionStrategy(families, config)

    def propose(self, state: SearchState, rng: random.Random) -> Proposal | None:
        if state.proposal_index % EVOLUTION_EVERY == EVOLUTION_EVERY - 1:
            proposal = self.evolution.propose(state, rng)
            if proposal is not None:
                return proposal
        return self.model.propose(state, rng)

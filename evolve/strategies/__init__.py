"""Search strategies: model-based ("auto"), evolution, random, exhaustive (see `make_strategy`)."""
from __future__ import annotations

from evolve.config import StrategyConfig
from evolve.families import Family
from evolve.strategies.auto import AutoStrategy
from evolve.strategies.base import Parent, Proposal, SearchState, Strategy, point_key
from evolve.strategies.evolution import EvolutionStrategy
from evolve.strategies.exhaustive import ExhaustiveStrategy
from evolve.strategies.model import ModelStrategy
from evolve.strategies.random_search import RandomStrategy


def make_strategy(config: StrategyConfig, families: dict[str, Family]) -> Strategy:
    if config.kind == "auto":
        return AutoStrategy(families, config)
    if config.kind == "model":
        return ModelStrategy(families, config)
    if config.kind == "evolution":
        return EvolutionStrategy(families, config)
    if config.kind == "random":
        return RandomStrategy(families)
    return ExhaustiveStrategy(families)


__all__ = ["AutoStrategy", "EvolutionStrategy", "ExhaustiveStrategy", "ModelStrategy", "Parent", "Proposal", "RandomStrategy",
           "SearchState", "Strategy", "make_strategy", "point_key"]

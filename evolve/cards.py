"""The kind of card a population's benches ran on, and the guard that keeps a run from
mixing two kinds in one population.

A bench's speedup is a ratio to the baseline on the card it ran on, and the ratio moves with
the card (the two_pass defaults: 3.14x fla on an H100, 3.31x on an H200). A population whose
benches ran on two kinds ranks its leaderboard and trains its model on figures that do not
compare. A confirmation runs beside the best on one server, so a promotion stays sound; what
goes wrong is quieter, which is why a run stops at the first bench on another card unless
it is told that mixing is meant (`remote.mixed_cards`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # the leaderboard reads bench_card, and the population imports the leaderboard
    from evolve.population import Population


def bench_card(metrics: Any) -> str | None:
    """The card a bench recorded (its `device` metric; None before 2026-12-05 or when unknown)."""
    card = metrics.get("device") if isinstance(metrics, dict) else None
    return card if isinstance(card, str) and card else None


def population_card(pop: Population, workload_id: int) -> str | None:
    """The card this workload's population is measured on: its best's, else that of the
    fastest candidate whose bench recorded one."""
    rows = pop.leaderboard(workload_id, limit=None)
    best = next((r.device for r in rows if r.best and r.device), None)
    return best or next((r.device for r in rows if r.device), None)


class CardGuard:
    """Holds the population's card (the first bench recorded sets it where none was) and
    says why a bench on another kind stops the run."""

    def __init__(self, card: str | None, allow_mixed: bool = False):
        self.card = card
        self.allow_mixed = allow_mixed

    def check(self, metrics: Any) -> str | None:
        card = bench_card(metrics)
        if card is None or self.allow_mixed:
            return None
        if self.card is None:
            self.card = card
            return None
        if card == self.card:
            return None
        return (f"a bench ran on {card!r} but this population's benches ran on {self.card!r}: speedups "
                "measured on two kinds of card do not compare (use another --db for this card, or set "
                "remote.mixed_cards = true to mix them knowingly)")

"""Drive a strategy against a landscape exactly as `evolve run` drives it.

The loop (evolve/loop.py) asks `strategy.propose(SearchState, rng)` whenever a pipeline
slot is free, with the population's correct candidates, its failed points and every key
proposed so far; a duplicate costs no evaluation and 64 in a row end the search. Here the
population is the landscape: a proposal's result is looked up instead of benchmarked. With
`concurrency` c, c pipelines are in flight and finish in the order they started, so each
proposal is made without the results of the c-1 before it (what several free GPUs see).
"""
from __future__ import annotations

import bisect
import random
import time

from pydantic import BaseModel

from evolve.config import StrategyConfig
from evolve.families import canonical_params
from evolve.replay.landscape import Landscape
from evolve.strategies import Parent, SearchState, make_strategy
from evolve.strategies.base import Failed

MAX_DUPLICATES = 64   # as in evolve.loop


class Trace(BaseModel):
    """One replayed run: the time (None: failed) of each evaluation, in the order started."""
    strategy: str
    seed: int
    times: list[float | None]
    propose_s: float                 # wall time spent in propose(), all proposals together
    proposals: int

    def evals_to(self, limit_ms: float) -> int | None:
        """1-based count of evaluations until the first at or under `limit_ms` (None: never)."""
        for i, t in enumerate(self.times, start=1):
            if t is not None and t <= limit_ms:
                return i
        return None

    def best_so_far(self) -> list[float | None]:
        best: float | None = None
        out = []
        for t in self.times:
            if t is not None and (best is None or t < best):
                best = t
            out.append(best)
        return out


def replay(landscape: Landscape, config: StrategyConfig, *, budget: int, concurrency: int = 1,
           stop_below_ms: float | None = None, label: str | None = None) -> Trace:
    family = landscape.family()
    families = {family.name: family}
    strategy = make_strategy(config, families)
    rng = random.Random(f"{config.seed}:1")      # as the loop seeds the first run of a database
    results = {canonical_params(p.params): p for p in landscape.points}
    times = [p.ms for p in landscape.points if p.ms is not None]
    ref_ms = results[canonical_params(family.defaults)].ms or sorted(times)[len(times) // 2]

    correct: list[Parent] = []        # sorted as Population.correct returns it: fastest first, then id
    order: list[tuple[float, int]] = []
    failed: list[Failed] = []
    tried: set = set()
    in_flight: list[tuple[int, dict]] = []
    out: list[float | None] = []
    next_id = 1
    proposals = 0
    spent = 0.0
    exhausted = False

    def finish_oldest() -> None:
        cid, params = in_flight.pop(0)
        point = results[canonical_params(params)]
        if point.ms is None:
            failed.append(Failed(id=cid, family=family.name, params=params, kind=point.failure or "runtime"))
        else:
            speedup = ref_ms / point.ms
            i = bisect.bisect(order, (-speedup, cid))
            order.insert(i, (-speedup, cid))
            correct.insert(i, Parent.model_construct(id=cid, family=family.name, params=params,
                                                     speedup=speedup, generation=0))

    while len(out) < budget and not exhausted:
        while len(in_flight) < concurrency and len(out) < budget:
            duplicates = 0
            while True:
                state = SearchState.model_construct(correct=list(correct), failed=list(failed), tried=tried,
                                                    proposal_index=proposals)
                started = time.perf_counter()
                proposal = strategy.propose(state, rng)
                spent += time.perf_counter() - started
                if proposal is None:
                    exhausted = True
                    break
                proposals += 1
                key = proposal.key
                if key in tried:
                    duplicates += 1
                    if duplicates >= MAX_DUPLICATES:
                        exhausted = not in_flight
                        break
                    continue
                tried.add(key)
                if not family.admits(proposal.params):
                    raise AssertionError(f"{config.kind} proposed a point outside the space: {proposal.params}")
                in_flight.append((next_id, dict(proposal.params)))
                next_id += 1
                point = results[key[1]]
                out.append(point.ms)
                break
            if exhausted or duplicates >= MAX_DUPLICATES:
                break
        if stop_below_ms is not None and any(t is not None and t <= stop_below_ms for t in out):
            break
        if in_flight:
            finish_oldest()
        elif exhausted:
            break
    return Trace(strategy=label or config.kind, seed=config.seed, times=out, propose_s=spent, proposals=proposals)

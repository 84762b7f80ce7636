"""The search's view of the population, kept up to date instead of read whole.

A strategy sees the correct candidates (latest bench passed, fastest first), the points
that failed in a way the point causes, and the tried keys (`SearchState`). Reading all of
it for every proposal cost about 0.25 s at 10 000 candidates (rows, their JSON
parameters, one model per row), more than the proposal itself. A `SearchView` reads only
the evaluations added since its last read, plus those it saw still running, and keeps one
`Parent` per candidate; the state it hands out is the one a full read gives, in the same
order, so a resumed run still proposes what an uninterrupted one would.

Rows can commit out of id order when several processes share a PostgreSQL population
(each takes its id from a sequence, then commits): every read looks `LAG` ids back, and
every `REFRESH` reads start over from nothing.
"""
from __future__ import annotations

from bisect import bisect_left

import numpy as np

from evolve.population import Population
from evolve.strategies.base import Columns, Failed, Parent, SearchState
from evolve.vocabulary import INFEASIBLE_KINDS

LAG = 256        # ids re-read below the highest seen: commits out of id order land there
REFRESH = 500    # reads between full reads: anything a lag could still miss heals then
FINAL = ("passed", "failed", "interrupted")
RESORT = 64      # changes in one read above which the order is sorted anew rather than patched


class SearchView:
    def __init__(self, pop: Population, workload_id: int, lag: int = LAG, refresh: int = REFRESH) -> None:
        self.pop = pop
        self.workload_id = workload_id
        self.lag, self.refresh = lag, refresh
        self.reads = 0
        self._reset()

    def _reset(self) -> None:
        self.mark = 0                                     # highest evaluation id seen
        self.running: set[int] = set()                   # evaluations seen unfinished: read again
        self.bench: dict[int, tuple[int, Parent | None]] = {}   # candidate -> (its latest passed/failed bench, parent if correct)
        self.infeasible: dict[int, tuple[int, Failed]] = {}     # candidate -> its first infeasible failure
        # Correct, fastest first, and each one's (-speedup, id) to bisect: a read changes a few
        # of 10 000, and sorting them all again cost more than the read.
        self._order: list[Parent] = []
        self._ranks: list[tuple[float, int]] = []
        self._columns = Columns.of([])                   # of the order, handed to strategies with it
        self._changes: list[tuple[Parent | None, Parent | None]] = []   # (was, is) since the order was patched
        self._failed: list[Failed] | None = None         # None: to list again

    def state(self, tried: set, proposals: int) -> SearchState:
        if self.reads % self.refresh == 0:
            self._reset()
        self.reads += 1
        rows = self.pop.evaluation_rows(self.workload_id, self.mark - self.lag, sorted(self.running))
        for row in rows:
            self._take(*row)
        self._patch_order()
        if self._failed is None:
            self._failed = [f for cid, (_, f) in sorted(self.infeasible.items()) if not self._is_correct(cid)]
        return SearchState.model_construct(correct=list(self._order), failed=list(self._failed), tried=tried,
                                           proposal_index=proposals).keep_columns(self._columns)

    def _patch_order(self) -> None:
        changes, self._changes = self._changes, []
        if len(changes) > RESORT:
            self._order = sorted((p for _, p in self.bench.values() if p is not None), key=_rank)
            self._ranks = [_rank(p) for p in self._order]
            self._columns = Columns.of(self._order)
            return
        ids, speedups, families = self._columns
        for was, now in changes:
            if was is not None:
                i = bisect_left(self._ranks, _rank(was))
                del self._ranks[i], self._order[i]
                ids, speedups, families = np.delete(ids, i), np.delete(speedups, i), np.delete(families, i)
            if now is not None:
                i = bisect_left(self._ranks, _rank(now))
                self._ranks.insert(i, _rank(now))
                self._order.insert(i, now)
                ids, speedups = np.insert(ids, i, now.id), np.insert(speedups, i, now.speedup)
                families = np.insert(families, i, now.family)   # type: ignore[arg-type]  # None too: object column
        if changes:
            self._columns = Columns(ids, speedups, families).frozen()

    def _is_correct(self, cid: int) -> bool:
        entry = self.bench.get(cid)
        return entry is not None and entry[1] is not None

    def _take(self, eid: int, cid: int, family: str | None, params: dict, generation: int, stage: str,
              status: str, speedup: float | None, kind: str | None) -> None:
        self.mark = max(self.mark, eid)
        if status not in FINAL:
            self.running.add(eid)
            return
        self.running.discard(eid)
        if stage == "bench" and status in ("passed", "failed"):
            latest = self.bench.get(cid)
            if latest is None or eid > latest[0]:   # a finished row never changes: read again, it is skipped
                parent = None
                if status == "passed" and speedup is not None:
                    parent = Parent.model_construct(id=cid, family=family, params=params, speedup=speedup,
                                                    generation=generation)
                self.bench[cid] = (eid, parent)
                self._changes.append((latest[1] if latest else None, parent))
                if cid in self.infeasible:
                    self._failed = None
        if status == "failed" and family is not None and kind in INFEASIBLE_KINDS:
            first = self.infeasible.get(cid)
            if first is None or eid < first[0]:
                self.infeasible[cid] = (eid, Failed.model_construct(id=cid, family=family, params=params, kind=kind))
                self._failed = None


def _rank(p: Parent) -> tuple[float, int]:
    return (-p.speedup, p.id)

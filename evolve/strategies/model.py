"""Model-based search: a Gaussian-process surrogate of log time per family, proposals by
expected improvement, discounted by the learned chance that a point fails.

- The first proposals are the seeds (each family's defaults), then `initial_points`
  random points; after that the model decides.
- Candidates scored each time: every untried admitted point when the space is small
  enough to enumerate, else a random sample; plus evolution's offspring of the best
  correct candidates (mutations and crossovers), so the model also steers the local
  search that works well on these spaces.
- Points in flight (proposed, no result yet) enter the model at their predicted value
  ("kriging believer"): the next proposal moves away from them, so concurrent slots get a
  diverse batch rather than one point's neighbours.
- Failed points (`SearchState.failed`) are never parents and never re-proposed; the
  chance of failing near them discounts the expected improvement.

Everything comes from the `SearchState` and the RNG, observations in candidate-id order,
so a resumed run proposes what an uninterrupted one would. Caches (the encoded space)
are pure functions of the families.
"""
from __future__ import annotations

import math
import operator
import random
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat
from typing import overload

import numpy as np

from evolve.config import StrategyConfig
from evolve.families import Family, Value, canonical_params, value_key
from evolve.strategies.base import (Failed, Parent, Proposal, SearchState, fastest_first, fresh_immigrant,
                                   point_key, untried_seed)
from evolve.strategies.evolution import EvolutionStrategy
from evolve.strategies.surrogate import Encoder, GaussianProcess, expected_improvement, failure_probability

ENUMERATE_LIMIT = 400_000    # spaces of up to this many admitted points are enumerated once (two_pass:
                             # 147,576 in 8.6 s and 139 MB of peak RSS on a 2-core VM) ...
WALK_LIMIT = 32_000_000      # ... when their product is small enough to walk: two_pass's 11,943,936 (it prunes
                             # early); a space pruned only at its last parameter 6.6 us a combination, so
                             # under 4 minutes, once a run
POOL = 3000                  # random candidates scored per proposal
OFFSPRING = 64               # evolution offspring added to them
RERANK = 200                 # candidates by expected improvement that the failure model re-scores
ROW_CACHE = 20_000           # point keys whose enumerated row a space remembers
TRAIN_CAP = 300              # observations per fit: the best half, the rest drawn at random


class _Space:
    """A family's admitted points, enumerated once where the space is small enough, held as
    one integer each (the parameters' value indices in mixed radix) beside the encoded matrix:
    two_pass's 98,808 points as dicts and key tuples took 475 MB, as codes they take 1.6 MB."""

    def __init__(self, family: Family):
        self.family = family
        self.encoder = Encoder(family)
        self.x: np.ndarray | None = None   # set where the space is enumerated
        self._names = list(family.parameters)
        self._values = [family.parameters[n] for n in self._names]
        self._index = [{value_key(v): i for i, v in enumerate(vals)} for vals in self._values]
        self._radix = np.cumprod([1] + [len(vals) for vals in self._values[:-1]], dtype=np.int64)
        # Enumerated, the candidates to score are drawn from the untried admitted points
        # directly. Otherwise each is a rejection sample, which in a space that admits 2 %
        # of its product (two_pass) cost seconds per proposal.
        if family.size_upper_bound() > WALK_LIMIT:
            return
        codes: list[int] = []
        blocks: list[np.ndarray] = []
        batch: list[dict[str, Value]] = []
        for point in family.points():
            if len(codes) == ENUMERATE_LIMIT:
                return
            codes.append(self.code(point))
            batch.append(point)
            if len(batch) == 4096:
                blocks.append(self.encoder.encode(batch))
                batch = []
        if not codes:
            return
        blocks.append(self.encoder.encode(batch))
        self.codes = np.asarray(codes, dtype=np.int64)   # row i: the i-th point of the walk
        self._order = np.argsort(self.codes, kind="stable")
        self._sorted = self.codes[self._order]
        self.x = np.concatenate(blocks)
        self.open = np.ones(len(codes), dtype=bool)    # not yet tried
        self._marked: set = set()
        self._rows: dict[tuple, int | None] = {}

    @property
    def enumerated(self) -> bool:
        return self.x is not None

    @property
    def size(self) -> int:
        return len(self.codes) if self.enumerated else 0

    def code(self, params: dict[str, Value]) -> int:
        return int(sum(int(r) * idx[value_key(params[n])]
                       for n, r, idx in zip(self._names, self._radix, self._index)))

    def point(self, row: int) -> dict[str, Value]:
        code = int(self.codes[row])
        out = {}
        for name, vals in zip(self._names, self._values):
            code, i = divmod(code, len(vals))
            out[name] = vals[i]
        return out

    def row(self, key: tuple) -> int | None:
        """The row of a point given by its canonical key, None where the space lacks it. The
        keys asked for are the population's (every proposal encodes its observations again),
        so each is worked out once."""
        if key in self._rows:
            return self._rows[key]
        found = self._find(dict((name, value) for name, (_, value) in key))
        if len(self._rows) >= ROW_CACHE:   # offspring keys come and go: start over rather than grow
            self._rows.clear()
        self._rows[key] = found
        return found

    def _find(self, params: dict[str, Value]) -> int | None:
        if len(params) != len(self._names):   # a point of another version of the family
            return None
        try:
            code = self.code(params)
        except (KeyError, TypeError):         # a value the family does not list
            return None
        at = int(np.searchsorted(self._sorted, code))
        return int(self._order[at]) if at < len(self._sorted) and self._sorted[at] == code else None

    def untried(self, name: str, tried: set) -> np.ndarray:
        """Indices of the points not in `tried`, kept up to date incrementally (tried only
        grows within a run; a smaller set, as from another state, starts over)."""
        if not self._marked <= tried:
            self.open[:] = True
            self._marked = set()
        for key in tried - self._marked:
            if key[0] == name and (row := self.row(key[1])) is not None:
                self.open[row] = False
        self._marked = set(tried)
        return np.flatnonzero(self.open)

    def encode(self, points: list[dict[str, Value]], keys: list[tuple] | None = None) -> np.ndarray:
        """Rows of the cached matrix where the space is enumerated (no Python loop per value)."""
        if self.x is None:
            return self.encoder.encode(points)
        rows = [self.row(k) for k in (keys if keys is not None else map(canonical_params, points))]
        found = [r for r in rows if r is not None]
        if len(found) < len(rows):   # not an admitted point of this space: encode it afresh
            return self.encoder.encode(points)
        return self.x[found]


class ModelStrategy:
    def __init__(self, families: dict[str, Family], config: StrategyConfig):
        self.families = families
        self.config = config
        self.evolution = EvolutionStrategy(families, config)
        self._spaces: dict[str, _Space] = {}
        # Candidate ids are never reused and their params never change: per-id caches.
        self._admits: dict[int, bool] = {}
        self._keys: dict[int, tuple] = {}
        self._held = _HeldKeys()
        # Keys interned to the tried set's own objects: sets of 10 000 keys meet every
        # proposal, and two equal keys that are not one object compare tuple by tuple.
        self._interned: dict[tuple, tuple] = {}
        self._tried: set[tuple] = set()   # the tried keys interned so far

    def _admitted(self, parent: Parent | Failed) -> bool:
        # callers pass only candidates of a family this strategy knows (an agent's has none)
        if parent.id not in self._admits:
            fam = self.families.get(parent.family) if parent.family is not None else None
            self._admits[parent.id] = fam is not None and fam.admits(parent.params)
        return self._admits[parent.id]

    def _key(self, cid: int, family: str, params: dict) -> tuple:
        if cid not in self._keys:
            key = point_key(family, params)
            self._keys[cid] = self._interned.setdefault(key, key)
        return self._keys[cid]

    def _intern_tried(self, tried: set[tuple]) -> None:
        fresh = tried - self._tried
        for key in fresh:
            self._interned.setdefault(key, key)
        self._tried |= fresh

    def _space(self, name: str) -> _Space:
        if name not in self._spaces:
            self._spaces[name] = _Space(self.families[name])
        return self._spaces[name]

    def propose(self, state: SearchState, rng: random.Random) -> Proposal | None:
        seed = untried_seed(self.families, state)
        if seed is not None:
            return seed
        ranked, usable, failed, seen = self._held_state(state)
        tried = state.tried | seen
        if sum(map(len, usable.values())) < max(2, self.config.initial_points):
            return self._random(state, tried, rng)
        # -log is decreasing: the same value as the least -log(speedup) over every candidate.
        best_y = min(-math.log(group[0].speedup) for group in usable.values() if len(group))
        scored: list[tuple[float, str, dict[str, Value]]] = []
        for name in self.families:
            cands, x_cand = self._candidates(name, ranked[name], tried, rng)
            if not cands:
                continue
            space = self._space(name)
            group = usable[name]
            obs = self._cap(group, rng) if len(group) >= 2 else group[:]
            fails = [f for f in failed if f.family == name and self._admitted(f)]   # inside today's space
            if len(obs) >= 2:
                x_obs = space.encode([p.params for p in obs], [self._key(p.id, name, p.params)[1] for p in obs])
                y_obs = np.array([-math.log(p.speedup) for p in obs])
                gp = GaussianProcess(x_obs, y_obs)
                pending = [_params(k[1]) for k in state.tried - seen if k[0] == name]
                pending = [p for p in pending if space.family.admits(p)]
                if pending:
                    x_pend = space.encode(pending)
                    mu_pend, _ = gp.predict(x_pend)
                    gp = GaussianProcess(np.vstack([x_obs, x_pend]), np.concatenate([y_obs, mu_pend]),
                                         lengths=(gp.length,))
                mu, sigma = gp.predict(x_cand)
                length = gp.length
            else:   # a family the model knows nothing of yet: the prior of all observations
                everyone = sorted((p for held in usable.values() for p in held[:]), key=lambda p: p.id)
                ys = np.array([-math.log(p.speedup) for p in everyone])
                mu = np.full(len(cands), ys.mean())
                sigma = np.full(len(cands), ys.std() or 1.0)
                length = math.sqrt(space.encoder.width) * 0.3
            score = expected_improvement(mu, sigma, best_y)
            if fails:
                # Only the leading candidates can win: the failure model discounts those.
                top = np.argsort(-score, kind="stable")[:RERANK]
                seen_x = space.encode([p.params for p in obs] + [f.params for f in fails],
                                      [self._key(p.id, name, p.params)[1] for p in obs + fails])
                flags = np.array([0.0] * len(obs) + [1.0] * len(fails))
                score = score[top] * (1.0 - failure_probability(x_cand[top], seen_x, flags, length))
                i = int(top[int(np.argmax(score))])
                scored.append((float(score.max()), name, cands[i]))
            else:
                i = int(np.argmax(score))
                scored.append((float(score[i]), name, cands[i]))
        if not scored:
            return None if self._exhausted(tried) else self._random(state, tried, rng)
        _, name, params = max(scored, key=lambda s: s[0])
        return Proposal(family=name, params=params, operator="model")

    def _held_state(self, state: SearchState) -> tuple[dict[str, _Ranked], dict[str, _Ranked],
                                                       list[Failed], set[tuple]]:
        """Per family, its admitted correct candidates fastest first, and those of them with a
        speedup to model; the failed points of the families in id order; the keys of both.
        From the state's columns and masks: at 10 000 candidates each Python pass over the
        objects cost milliseconds. The state comes fastest first already (checked), so
        nothing is sorted, and only candidates new since the last proposal are keyed."""
        correct = state.correct
        cols = state.columns()
        ordered = fastest_first(cols)
        ids = cols.ids.tolist()
        admitted = list(map(self._admits.get, ids))
        for i in compress(range(len(ids)), map(operator.is_, admitted, repeat(None))):
            admitted[i] = correct[i].family in self.families and self._admitted(correct[i])
        in_space = np.array(admitted, dtype=bool)
        positive = cols.speedups > 0
        # Positions in the fastest-first order (the state's own, or one sorted here).
        order = np.arange(len(ids)) if ordered else np.lexsort((cols.ids, -cols.speedups))
        ranked: dict[str, _Ranked] = {}
        usable: dict[str, _Ranked] = {}
        modelled = np.zeros(len(ids), dtype=bool)
        for name in self.families:
            mine = in_space & (cols.families == name)
            ranked[name] = _Ranked(correct, order[mine[order]])
            mine &= positive
            usable[name] = _Ranked(correct, order[mine[order]])
            modelled |= mine
        failed = sorted((f for f in state.failed if f.family in self.families), key=lambda f: f.id)
        held = set(cols.ids[modelled].tolist())
        held.update(f.id for f in failed)
        new = held - self._held.ids
        fresh: list[Parent | Failed] = []
        if new:
            fresh = [correct[i] for i in np.flatnonzero(modelled & np.isin(cols.ids, list(new)))]
            new -= {p.id for p in fresh}   # a candidate in both lists is held once
            fresh += [f for f in failed if f.id in new]
        self._intern_tried(state.tried)
        return ranked, usable, failed, self._held.sync(held, fresh, self._key)

    # ---- candidates -----------------------------------------------------------------------
    def _candidates(self, name: str, ranked: _Ranked, tried: set,
                    rng: random.Random) -> tuple[list[dict[str, Value]], np.ndarray]:
        """Untried admitted points to score, and their encodings; `ranked`: the family's
        admitted correct candidates, fastest first."""
        space = self._space(name)
        # Offspring of the best correct candidates: what evolution would try next.
        pool = ranked[: self.config.population_size]
        children = {}
        for params in self._offspring(space.family, pool, rng):
            k = canonical_params(params)
            if (name, k) not in tried and space.family.admits(params):
                children[k] = params
        if space.x is not None:   # enumerated: the candidates and their encoding together
            untried = space.untried(name, tried).tolist()
            if len(untried) > POOL:
                untried = rng.sample(untried, POOL)
            rows = set(untried) | {r for k in children if (r := space.row(k)) is not None}
            idx = sorted(rows)
            return [space.point(i) for i in idx], space.x[idx]
        out: dict[tuple, dict[str, Value]] = {}
        for _ in range(POOL):
            p = space.family.sample(rng)
            k = canonical_params(p)
            if (name, k) not in tried:
                out[k] = p
        out.update(children)
        cands = list(out.values())
        return cands, space.encoder.encode(cands)

    def _offspring(self, family: Family, pool: list, rng: random.Random) -> list[dict[str, Value]]:
        evo = self.evolution
        out = []
        for _ in range(OFFSPRING if pool else 0):
            a = evo._tournament(pool, rng)
            mates = [p for p in pool if p.id != a.id]
            if mates and rng.random() < self.config.crossover_rate:
                b = evo._tournament(mates, rng)
                out.append(evo._mutate(family, evo._crossover(a.params, b.params, rng), rng))
            else:
                out.append(evo._mutate(family, a.params, rng))
        return out

    @staticmethod
    def _cap(ranked: _Ranked, rng: random.Random) -> list[Parent]:
        """The observations to fit (`ranked`: fastest first), in candidate-id order."""
        if len(ranked) <= TRAIN_CAP:
            return sorted(ranked[:], key=lambda p: p.id)
        keep = ranked[: TRAIN_CAP // 2]
        rest = ranked.tail(TRAIN_CAP // 2)   # sampled from, never read whole
        return sorted(keep + rng.sample(rest, TRAIN_CAP - len(keep)), key=lambda p: p.id)

    def _random(self, state: SearchState, tried: set, rng: random.Random) -> Proposal | None:
        view = SearchState.model_construct(correct=state.correct, failed=state.failed, tried=tried,
                                           proposal_index=state.proposal_index)
        return fresh_immigrant(self.families, view, rng)

    def _exhausted(self, tried: set) -> bool:
        for name in self.families:
            space = self._space(name)
            if not space.enumerated or space.untried(name, tried).size:
                return False
        return True


class _Ranked(Sequence[Parent]):
    """Candidates of a state by position, fetched only when read: a proposal reads the best
    few and a random sample of the rest, never all 10 000. A slice is a list."""

    def __init__(self, correct: list[Parent], positions: np.ndarray):
        self.correct = correct
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, i: int) -> Parent: ...
    @overload
    def __getitem__(self, i: slice) -> list[Parent]: ...

    def __getitem__(self, i: int | slice) -> Parent | list[Parent]:
        if isinstance(i, slice):
            return [self.correct[j] for j in self.positions[i].tolist()]
        return self.correct[int(self.positions[i])]

    def tail(self, start: int) -> _Ranked:
        return _Ranked(self.correct, self.positions[start:])


class _HeldKeys:
    """The point keys of the candidates a state holds, kept in step by candidate id: a
    proposal changes a few of 10 000, and hashing every nested key tuple anew cost about
    30 ms. Counts, since two candidates can hold one point."""

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.count: dict[tuple, int] = {}
        self.keys: set[tuple] = set()

    def sync(self, ids: set[int], fresh: Iterable[Parent | Failed],
             key: Callable[[int, str, dict], tuple]) -> set[tuple]:
        """`ids`: the candidates held now; `fresh`: those of them not held at the last call."""
        for c in fresh:
            self._add(key(c.id, c.family or "", c.params))
        for cid in self.ids - ids:
            self._drop(key(cid, "", {}))   # cached when it was added
        self.ids = ids
        return self.keys

    def _add(self, k: tuple) -> None:
        n = self.count.get(k, 0)
        self.count[k] = n + 1
        if not n:
            self.keys.add(k)

    def _drop(self, k: tuple) -> None:
        n = self.count[k] - 1
        if n:
            self.count[k] = n
        else:
            del self.count[k]
            self.keys.discard(k)


def _params(key: tuple) -> dict[str, Value]:
    return {name: value for name, (_type, value) in key}

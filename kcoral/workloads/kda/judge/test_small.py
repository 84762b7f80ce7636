"""Small-shape correctness test of one candidate, across 12 regimes, run on the server by
`kcoral python` / `run_gputest` from a directory holding judge/, workload.json and the
candidate.

Environment: CANDIDATE (candidate dir, default "candidate"), CASES (comma-separated regime
names or "all"), H and T (heads and tokens; K, V and the math come from workload.json).
Prints exactly one `regime=NAME bad=FRACTION` line per regime run, FRACTION being the
share of output + final_state elements that fail the workload's rules (non-finite ones
included; an output failing only its RMS bound counts one element); exits 0 iff all are 0.

QUICK_CALLS=N (default 0): once every regime has passed, also time N calls at the scored
shape (the workload's own B, T and H; the cache flushed before each call, as the judge
does; wall time on a GPU, the process's CPU time on the CPU) and print `quick_ms=MEDIAN
calls=N`. A cheap first reading of speed for a search to
rank candidates by before the official benchmark; the candidate shares this process and
could fake it, so it may only ever cost a candidate its bench, never earn it anything.
A candidate that raises at the scored shape gets a `regime=scored_shape bad=1.00e+00` line.

A diagnostic, not a verdict: the candidate runs in this process, beside the checks. Only
the official benchmark (judge.py), which never shares a process with a candidate, decides.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from judge.backend import BF16, bits_view, make_backend, poison, write_into  # noqa: E402
from judge.compare import check_output  # noqa: E402
from judge.harness import load_solution  # noqa: E402
from judge.inputs import INPUT_NAMES, LOOSE_REGIMES, holdout_cases, holdout_inputs, regime_inputs  # noqa: E402
from judge.reference import recurrence_f64  # noqa: E402
from judge.spec import load_spec  # noqa: E402

STRESS = ("saturated", "strong", "mixed_depth", "switch", "boundary", "correlated", "random_depth")
REGIMES = ("scored",) + STRESS + ("probes", "holdout_mix", "refresh", "integrity")
PROBE_LENGTHS = (1, 17, 63, 65, 127, 129)
QUICK_MARK = "# quick timing"   # kcoral.bench.run looks for it (this file runs without kcoral, so it is spelled twice)


class Prepared:
    """One `setup` of the candidate at length T, on buffers of this process."""

    def __init__(self, be: Any, spec: Any, module: Any, inputs: dict, T: int) -> None:
        xp = be.xp
        self.be, self.inputs = be, inputs
        self.output = xp.empty((spec.B, T, spec.H, spec.V), dtype=BF16)
        self.final_state = xp.empty((spec.B, spec.H, spec.V, spec.K), dtype=xp.float32)
        self.data = dict(inputs, output=self.output, final_state=self.final_state, scale=float(spec.scale))
        self.fn = module.setup(self.data, spec.B, T, spec.H)
        be.sync()

    def refill(self, fresh: dict) -> None:
        for name in INPUT_NAMES:
            write_into(self.be.xp, self.inputs[name], fresh[name])

    def call(self) -> list[str]:
        """Poison, call once, synchronise; return integrity problems (empty if none)."""
        xp = self.be.xp
        before = {n: bits_view(xp, self.inputs[n]).copy() for n in INPUT_NAMES}
        poison(xp, self.output)
        poison(xp, self.final_state)
        self.fn()
        self.be.sync()
        problems = [f"the call changed its inputs: {n}" for n in INPUT_NAMES
                    if not bool((bits_view(xp, self.inputs[n]) == before[n]).all())]
        for key, buf in (("output", self.output), ("final_state", self.final_state)):
            if self.data.get(key) is not buf:
                problems.append(f"data[{key!r}] was replaced; outputs must be written into the given buffers")
        return problems


class Ctx:
    def __init__(self) -> None:
        spec = load_spec(HERE / "workload.json")
        H = int(os.environ.get("H", min(spec.H, 8)))
        T = int(os.environ.get("T", min(spec.T, 256)))
        self.scored_spec = spec
        self.spec = dataclasses.replace(spec, B=1, H=H, T=T)
        self.be = make_backend(spec.device)
        self.module = load_solution(HERE / os.environ.get("CANDIDATE", "candidate"), "kda_candidate")

    def prepared(self, T: int, seed: int) -> Prepared:
        return Prepared(self.be, self.spec, self.module, regime_inputs(self.be, self.spec, T, seed), T)

    def bad(self, prep: Prepared, loose: bool) -> tuple[int, int]:
        """(bad elements, elements) of the last call against the float64 recurrence."""
        xp, spec = self.be.xp, self.spec
        ref_out, ref_state = recurrence_f64(xp, prep.inputs, spec.scale, spec.gate_floor, spec.norm_eps)
        tol = spec.loose_tolerance if loose else spec.tolerance
        bad = total = 0
        for name, x, ref in (("output", prep.output, ref_out), ("final_state", prep.final_state, ref_state)):
            v = check_output(xp, name, x, ref, tol)
            bad += v.bad if (v.ok or v.bad) else 1
            total += v.size
            if not v.ok:
                print(f"  {v.detail}", file=sys.stderr)
        return bad, total

    def checked(self, prep: Prepared, fresh: dict, loose: bool = False) -> tuple[int, int]:
        prep.refill(fresh)
        problems = prep.call()
        bad, total = self.bad(prep, loose)
        if problems:
            print("  " + "; ".join(problems), file=sys.stderr)
            bad = total
        return bad, total


def run_regime(ctx: Ctx, name: str) -> float:
    be, spec, T = ctx.be, ctx.spec, ctx.spec.T
    seed = spec.seed + 1000 + REGIMES.index(name)
    if name == "scored" or name in STRESS:
        prep = ctx.prepared(T, seed)
        bad, total = ctx.checked(prep, regime_inputs(be, spec, T, seed + 1, name), name in LOOSE_REGIMES)
    elif name == "probes":
        bad = total = 0
        for i, L in enumerate(PROBE_LENGTHS):
            b, t = ctx.checked(ctx.prepared(L, seed + i), regime_inputs(be, spec, L, seed + 50 + i, "mixed_depth"))
            bad, total = bad + b, total + t
    elif name == "holdout_mix":
        # Locally seeded draws of the holdout's recipe (the real holdout is salted).
        bad = total = 0
        small = dataclasses.replace(spec, holdout=dataclasses.replace(spec.holdout, t_min=1, t_max=T))
        for case in holdout_cases([seed * 7919 + i for i in range(5)], small):
            b, t = ctx.checked(ctx.prepared(case.T, case.seed), holdout_inputs(be, small, case), case.loose)
            bad, total = bad + b, total + t
    elif name == "refresh":
        # Two calls, inputs rewritten in place between them: the second must follow.
        prep = ctx.prepared(T, seed)
        b1, t1 = ctx.checked(prep, regime_inputs(be, spec, T, seed + 1))
        first = bits_view(be.xp, prep.output).copy()
        b2, t2 = ctx.checked(prep, regime_inputs(be, spec, T, seed + 2))
        if bool((bits_view(be.xp, prep.output) == first).all()):
            print("  second call replayed the first call's output", file=sys.stderr)
            b2 = t2
        bad, total = b1 + b2, t1 + t2
    elif name == "integrity":
        prep = ctx.prepared(T, seed)
        prep.refill(regime_inputs(be, spec, T, seed + 1))
        problems = prep.call()
        bad, total = (1, 1) if problems else (0, 1)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
    else:
        raise ValueError(name)
    return bad / total if total else 1.0


def quick_ms(ctx: Ctx, calls: int) -> float:
    """Median time of `calls` calls at the scored shape, each after a cache flush: wall time
    on a GPU, this process's CPU time on the CPU (as the judge times the CPU twin: other
    programs on a loaded machine must not make a candidate look slow)."""
    be, spec = ctx.be, ctx.scored_spec
    xp = be.xp
    clock = time.process_time if be.device == "cpu" else time.perf_counter
    prep = Prepared(be, spec, ctx.module, regime_inputs(be, spec, spec.T, spec.seed + 2000), spec.T)
    flush = xp.empty(int(spec.timing.flush_bytes), dtype=xp.uint8)
    for _ in range(2):   # compile and warm up outside the timed calls
        prep.fn()
    times = []
    for i in range(calls):
        flush.fill(i & 0xFF)
        be.sync()
        started = clock()
        prep.fn()
        be.sync()
        times.append((clock() - started) * 1000.0)
    return statistics.median(times)


def main() -> int:
    wanted = os.environ.get("CASES", "all").strip()
    names = list(REGIMES) if wanted in ("", "all") else [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = [n for n in names if n not in REGIMES]
    if unknown:
        print(f"unknown CASES {unknown}; known: {', '.join(REGIMES)}", file=sys.stderr)
        return 2
    try:
        quick_calls = int(os.environ.get("QUICK_CALLS", "0") or 0)
    except ValueError:
        quick_calls = -1
    if quick_calls < 0:
        print(f"QUICK_CALLS must be a whole number of calls (0: none), not {os.environ['QUICK_CALLS']!r}",
              file=sys.stderr)
        return 2
    ctx = Ctx()
    print(f"# device={ctx.be.name} H={ctx.spec.H} T={ctx.spec.T} K={ctx.spec.K} V={ctx.spec.V}", flush=True)
    worst = 0.0
    for name in names:
        try:
            frac = run_regime(ctx, name)
        except Exception:  # noqa: BLE001 - a crashing candidate makes the regime all bad
            traceback.print_exc()
            frac = 1.0
        worst = max(worst, frac)
        print(f"regime={name} bad={frac:.2e}", flush=True)
    if worst == 0 and quick_calls:
        print(QUICK_MARK, flush=True)   # every regime passed: a timeout from here on costs only the reading
        try:
            print(f"quick_ms={quick_ms(ctx, quick_calls):.4f} calls={quick_calls}", flush=True)
        except Exception:  # noqa: BLE001 - correct at the small shapes, yet it fails at the scored one
            traceback.print_exc()
            print("regime=scored_shape bad=1.00e+00", flush=True)
            return 1
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

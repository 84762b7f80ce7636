"""The official figures from timed batches, and which clock they come from.

A timed batch runs `warmup + calls` calls one at a time in one host (host.py): per call the
judge writes fresh inputs into the host's memory, poisons the outputs and flushes the cache
(a buffer of `flush_bytes` of its own written), and the host times the call alone and
answers once its work is done. On a GPU the time is a pair of CUDA events around the call;
on the CPU, the host's CPU time. Those times come from the host's process,
which the candidate controls; the judge keeps its own clock around each call (from
writing its inputs to the snapshot of its outputs), sums it over the batch, and runs the
same batch with a no-op candidate in a trusted host. What the judge saw beyond the no-op batch is the work of the
calls: the host's times stand only if they account for it within the slack; otherwise the
judge's own figure is used, and the report says so.

On a GPU the weighing is per call, over the timed calls, by medians: the judge's window of
a call less the median window of the no-op batch (the protocol's own cost: 0.8 GB of inputs
written and 0.2 GB of outputs snapshot, a few ms a call on the H200) is what the call cost.
The host does nothing per call but the call, so nothing in that no-op window is a step a
candidate could skip to make room for understated times (calls.py). Sums over a batch let the
protocol's noise (a few ms a batch, and a fresh host's first-call costs in its warm-up
calls) outweigh a 1 ms kernel; a median is not moved by a few slow calls, and a host that
understates more than half of its calls, the only way to move the median it is scored by,
shows on the median of its windows. Each call's inputs are written only inside its own
window, so no call can do another's work.

On the CPU both clocks are CPU time instead (cpuclock.py): the host's process CPU time per
call, the judge's reading of every process it started. Wall time on a shared machine is
the machine's load as much as the candidate's work. A batch whose CPU reading cannot be
taken whole (tasks came or went) gets the judge's wall figure.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import cpuclock
from .backend import Backend
from .spec import Timing

if TYPE_CHECKING:
    from .calls import Batch


@dataclass
class Figure:
    ms: float  # the per-call figure of one batch: median of the timed calls, or the judge's mean
    clock: str  # "host" (median of the host's times) | "host_mean" (their mean) | "judge"
    wall_ms: float  # the judge's measure of the batch (CPU ms when judge_clock is "cpu")
    null_wall_ms: float  # the same for the no-op batch
    host_total_ms: float
    why: str = ""
    judge_clock: str = "wall"  # "wall" | "cpu"
    per_call: dict | None = None  # GPU: the timed calls' windows, the no-op's, the host's times

    def as_dict(self) -> dict:
        out = {"ms": self.ms, "clock": self.clock, "judge_clock": self.judge_clock, "wall_ms": self.wall_ms,
               "null_wall_ms": self.null_wall_ms, "host_total_ms": self.host_total_ms,
               "unexplained_ms": self.wall_ms - self.null_wall_ms - self.host_total_ms}
        if self.per_call is not None:
            out["per_call"] = self.per_call
        if self.why:
            out["why"] = self.why
        return out


def clock_figure(batch: Batch, null: Batch, t: Timing, *, trusted: bool = False, calibration_ms: float = 0.0) -> Figure:
    """The per-call figure of one batch. `trusted`: the baseline's own batch in the judge's
    host, whose times are the judge's own and are kept (the weighing still runs, so its
    unexplained time is on record, and is the next argument). `calibration_ms`: what that
    trusted batch's calls cost beyond the no-op's and their own time, per call (GPU)."""
    n = len(batch.host_ms)
    if getattr(batch, "cpu_clock", False):
        if batch.cpu_ms is None or null.cpu_ms is None:
            # The host's CPU times cannot be weighed: the judge's wall figure stands.
            own = batch.wall_ms - null.wall_ms
            why = (f"tasks started or ended during the batch, so the CPU time of the judge's processes could "
                   f"not be read whole; the judge's wall clock figure {own / n:.6f} ms/call used")
            return Figure(max(own, 0.0) / n, "judge", batch.wall_ms, null.wall_ms, math.fsum(batch.host_ms), why)
        return _weighed(n, batch.cpu_ms, null.cpu_ms, batch, t, "cpu")
    if batch.windows_ms[t.warmup:] and null.windows_ms[t.warmup:]:
        return _weighed_per_call(batch, null, t, trusted, calibration_ms)
    return _weighed(n, batch.wall_ms, null.wall_ms, batch, t, "wall")


def _weighed_per_call(batch: Batch, null: Batch, t: Timing, trusted: bool, calibration_ms: float) -> Figure:
    w = t.warmup
    windows, null_windows, host = batch.windows_ms[w:], null.windows_ms[w:], batch.host_ms[w:]
    protocol = statistics.median(null_windows)
    # The judge's figure for a call: its median window less the no-op's. Not less the
    # calibration too: that is the baseline's extra, not this host's, and a host whose
    # times were refused must not come out ahead of its honest figure (on the H200 a host
    # reporting a tenth of its CUDA-event times got 2.56x against the honest 2.38x so).
    own = statistics.median(windows) - protocol
    detail: dict[str, Any] = {"windows_ms": [round(x, 4) for x in windows], "null_windows_ms": [round(x, 4) for x in null_windows],
              "host_ms": [round(x, 4) if math.isfinite(x) else None for x in host]}
    fig: dict[str, Any] = dict(wall_ms=batch.wall_ms, null_wall_ms=null.wall_ms, host_total_ms=math.fsum(batch.host_ms),
               judge_clock="wall", per_call=detail)
    if all(math.isfinite(x) for x in host):
        median = statistics.median(host)
        # What the judge saw of each call beyond the protocol and the host's own time.
        unexplained = statistics.median(wi - hi for wi, hi in zip(windows, host)) - protocol
        # A call that does real GPU work costs the protocol more than a no-op call does
        # (0.1-0.5 ms a call on the H200, the same for fla in the judge's own host as for a
        # candidate): the trusted baseline's batch of the same trial measures it.
        allowed = median * t.clock_slack_rel + t.clock_slack_call_ms + max(calibration_ms, 0.0)
        detail.update(unexplained_ms=round(unexplained, 4), allowed_ms=round(allowed, 4),
                      calibration_ms=round(max(calibration_ms, 0.0), 4))
        if trusted or unexplained <= allowed:
            return Figure(median, "host", why="", **fig)
        why = (f"the judge's clock saw {own:.4f} ms a call (median window less the no-op's), the host's median "
               f"is {median:.4f} ms, {unexplained:.4f} ms a call unexplained (allowed {allowed:.4f}); "
               f"the judge's figure {own:.6f} ms/call used")
    else:
        why = f"the host's times are unusable; the judge's figure {own:.6f} ms/call used"
    return Figure(max(own, 0.0), "judge", why=why, **fig)


def _weighed(n: int, judged_ms: float, null_ms: float, batch: Batch, t: Timing, judge_clock: str) -> Figure:
    own = judged_ms - null_ms  # what the calls cost, by the judge's clock
    host_total = math.fsum(batch.host_ms)
    allowed = host_total * (1 + t.clock_slack_rel) + t.clock_slack_ms
    timed = batch.host_ms[t.warmup:]
    if math.isfinite(host_total) and own <= allowed and timed:
        median, mean = statistics.median(timed), host_total / n
        # Every set of inputs of a batch is in memory the host maps, so a candidate could do
        # all the batch's work in a few calls (warm-up ones included) and answer the rest
        # from what it computed: the median would then be of empty calls. The mean over every
        # call counts that work; it stands in when it is beyond the median's slack.
        if mean > median * (1 + t.clock_slack_rel) + t.clock_slack_ms / n:
            why = (f"the host's calls are uneven: median {median:.6f} ms, mean over all {n} calls "
                   f"{mean:.6f} ms; the mean used")
            return Figure(mean, "host_mean", judged_ms, null_ms, host_total, why, judge_clock)
        return Figure(median, "host", judged_ms, null_ms, host_total, judge_clock=judge_clock)
    why = (f"the judge's clock saw {own:.3f} ms of calls, the host's times account for {host_total:.3f} ms "
           f"(allowed {allowed:.3f}); the judge's figure {own / n:.6f} ms/call used")
    return Figure(max(own, 0.0) / n, "judge", judged_ms, null_ms, host_total, why, judge_clock)


def method_text(be: Backend, t: Timing) -> str:
    mib = t.flush_bytes / 2**20
    if be.device == "cuda":
        per_call = "CUDA events around each call on the host's stream"
    elif cpuclock.available():
        per_call = "CPU time per call (the host's process CPU clock, every thread; one BLAS thread)"
    else:
        per_call = "perf_counter per call in the host (one BLAS thread; wall time: not in the server's sandbox)"
    per_call += (f"; before each call the judge writes its inputs into the host's memory, poisons its "
                 f"outputs and flushes the cache ({mib:.0f} MiB of its own memory written)")
    if be.device == "cuda" and t.preroll_ms > 0:
        per_call += f", then keeps the GPU busy {t.preroll_ms:g} ms while the call's launches queue"
    cpu = be.device != "cuda" and cpuclock.available()
    return (f"{per_call}, fresh inputs every call, written only inside its window, every call verified; {t.trials} trials x {t.calls} calls "
            f"(+{t.warmup} warm-up), baseline and kernel in separate processes, alternating by trial, "
            f"fresh setup per trial; weighed against the judge's own clock"
            + (" (the CPU clocks of every process it started)" if cpu else "")
            + "; a trial whose host times are refused is measured once more, on fresh hosts and inputs, and the "
              "re-measure kept only where its host times pass; mean of trial medians")


Pair = tuple[Figure, Figure]  # one trial: the baseline's (or the incumbent's) figure, the kernel's


def refused(pair: Pair, against: bool) -> list[str]:
    """The sides of a trial measured in an untrusted host whose times the judge refused
    (the baseline's own batch runs in the judge's host and is never refused)."""
    sides = (("incumbent", pair[0]),) if against else ()
    return [who for who, f in (*sides, ("kernel", pair[1])) if f.clock == "judge"]


def settle(first: Pair, again: Pair, against: bool) -> tuple[Pair, str]:
    """A trial whose host times were refused is measured once more, every batch of it again
    (baseline, no-op, fresh candidate hosts, new inputs). On the H200 an honest kernel's trial
    is now and then refused: the judge's windows run about 0.3 ms a call longer through a
    whole trial while the host's CUDA events do not move, and the judge's clock then costs
    it 10-25 %. The re-measure replaces the first only where fewer of its sides are refused:
    its host times then passed the same weighing the first failed, so it is no second chance
    to understate, and a host that understates every time keeps the judge's clock, at the
    slower of its two measures."""
    before, after = refused(first, against), refused(again, against)
    if len(after) < len(before):
        return again, f"re-measured once ({', '.join(before)} refused); the re-measure's host times stand"
    refused_twice = f"re-measured once ({', '.join(before)} refused); refused again ({', '.join(after)})"
    if against:  # both sides untrusted: the first stays
        return first, f"{refused_twice}, the first measure kept"
    # The candidate's figures are then the judge's clock's, which is noisy at the 10 % level
    # (on an H100 a refused trial read 0.934 ms a call, honest events of the same kernel
    # 1.027): of two draws it keeps the one less favourable to the host that understated.
    if _ratio(again) > _ratio(first):
        return again, f"{refused_twice}, the slower measure (the re-measure) kept"
    return first, f"{refused_twice}, the slower measure (the first) kept"


def _ratio(pair: Pair) -> float:
    """The candidate's time over the baseline's in one trial (higher: slower)."""
    fb, fc = pair
    return fc.ms / fb.ms if fb.ms > 0 else math.inf


def summarise(trials: list[Pair], others: dict[int, Pair] | None = None) -> dict:
    """`others`: by trial index, the measure a re-measure replaced or did not replace (on
    record either way)."""
    others = others or {}
    rows = [_trial_dict(pair) for pair in trials]
    for i, other in others.items():
        rows[i]["other_measure"] = _trial_dict(other)
    b = [fb.ms for fb, _ in trials]
    k = [fc.ms for _, fc in trials]
    b_mean, k_mean = statistics.fmean(b), statistics.fmean(k)
    return {
        "baseline_ms": b_mean,
        "kernel_ms": k_mean,
        "speedup": b_mean / k_mean if k_mean > 0 else float("inf"),
        "spread": {
            "baseline": (max(b) - min(b)) / b_mean if b_mean > 0 else 0.0,
            "kernel": (max(k) - min(k)) / k_mean if k_mean > 0 else 0.0,
        },
        "trials": rows,
    }


def _trial_dict(pair: Pair) -> dict:
    fb, fc = pair
    return {"baseline_ms": fb.ms, "kernel_ms": fc.ms, "baseline": fb.as_dict(), "kernel": fc.as_dict()}

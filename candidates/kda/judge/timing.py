"""The official figures from timed batches, and which clock they come from.

A timed batch runs `warmup + calls` calls one at a time in one host (host.py): per call the
judge writes fresh inputs into the lent block, and the host copies them in, poisons the
outputs, flushes the cache (a buffer of `flush_bytes` written), times the call alone and
copies its outputs out before answering. On a GPU the time is a pair of CUDA events
around the call; on the CPU, perf_counter. Those times come from the host's process,
which the candidate controls; the judge keeps its own clock around each call (from
writing its inputs to the snapshot of its outputs), sums it over the batch, and runs the
same batch with a no-op candidate in a trusted host. What the judge saw beyond the no-op batch is the work of the
calls: the host's times stand only if they account for it within the slack; otherwise the
judge's own figure (that time over the number of calls) is used, and the report says so.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .backend import Backend
from .spec import Timing


@dataclass
class Figure:
    ms: float  # the per-call figure of one batch: median of the timed calls, or the judge's mean
    clock: str  # "host" (median of the host's times) | "host_mean" (their mean) | "judge"
    wall_ms: float
    null_wall_ms: float
    host_total_ms: float
    why: str = ""

    def as_dict(self) -> dict:
        return {"ms": self.ms, "clock": self.clock, "wall_ms": self.wall_ms, "null_wall_ms": self.null_wall_ms,
                "host_total_ms": self.host_total_ms,
                "unexplained_ms": self.wall_ms - self.null_wall_ms - self.host_total_ms}


def clock_figure(batch, null, t: Timing) -> Figure:
    n = len(batch.host_ms)
    own = batch.wall_ms - null.wall_ms  # what the calls cost, by the judge's clock
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
            return Figure(mean, "host_mean", batch.wall_ms, null.wall_ms, host_total, why)
        return Figure(median, "host", batch.wall_ms, null.wall_ms, host_total)
    why = (f"the judge's clock saw {own:.3f} ms of calls, the host's times account for {host_total:.3f} ms "
           f"(allowed {allowed:.3f}); the judge's figure {own / n:.6f} ms/call used")
    return Figure(max(own, 0.0) / n, "judge", batch.wall_ms, null.wall_ms, host_total, why)


def method_text(be: Backend, t: Timing) -> str:
    mib = t.flush_bytes / 2**20
    if be.device == "cuda":
        per_call = f"CUDA events around each call on the host's stream (refill, poison, flush {mib:.0f} MiB, start, call, end)"
    else:
        per_call = f"perf_counter per call in the host, {mib:.0f} MiB buffer written before each call"
    return (f"{per_call}, fresh inputs every call, lent only inside its window, every call verified; {t.trials} trials x {t.calls} calls "
            f"(+{t.warmup} warm-up), baseline and kernel in separate processes, alternating by trial, "
            f"fresh setup per trial; weighed against the judge's own clock; mean of trial medians")


def summarise(trials: list[tuple[Figure, Figure]]) -> dict:
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
        "trials": [{"baseline_ms": fb.ms, "kernel_ms": fc.ms, "baseline": fb.as_dict(), "kernel": fc.as_dict()}
                   for fb, fc in trials],
    }

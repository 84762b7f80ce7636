"""The official timer: baseline and candidate alternately, L2 flushed before every call.

GPU: CUDA events enqueued back to back on the current stream (flush, start, call, end, ...)
and one synchronisation at the end of the trial, then a device-wide synchronisation whose
extra wait exposes work the events did not see. CPU: perf_counter around each call, a
cache-sized buffer written before each.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .backend import Backend
from .spec import Timing


@dataclass
class TrialTimes:
    baseline_ms: list[float] = field(default_factory=list)
    kernel_ms: list[float] = field(default_factory=list)
    wall_ms: float = 0.0
    span_ms: float = 0.0
    leftover_ms: float = 0.0  # device sync wait after the stream's last event completed
    flag: str = ""  # non-empty: the wall clock disagrees with the events

    @property
    def baseline_median(self) -> float:
        return statistics.median(self.baseline_ms)

    @property
    def kernel_median(self) -> float:
        return statistics.median(self.kernel_ms)


def method_text(be: Backend, t: Timing) -> str:
    mib = t.flush_bytes / 2**20
    if be.device == "cuda":
        per_call = f"CUDA events back to back on the current stream (flush {mib:.0f} MiB, start, call, end), one sync per trial"
    else:
        per_call = f"perf_counter per call, {mib:.0f} MiB buffer written before each call"
    return (f"{per_call}; {t.trials} trials x {t.calls} calls, baseline and kernel alternating, "
            f"{t.warmup} warm-up calls each, fresh setup per trial; mean of trial medians")


def time_trial(be: Backend, t: Timing, fn_baseline, fn_kernel) -> TrialTimes:
    for _ in range(t.warmup):
        fn_baseline()
        fn_kernel()
    be.sync()
    if be.device == "cuda":
        return _gpu_trial(be, t, fn_baseline, fn_kernel)
    return _cpu_trial(be, t, fn_baseline, fn_kernel)


def _gpu_trial(be: Backend, t: Timing, fn_baseline, fn_kernel) -> TrialTimes:
    cp = be.xp
    flush = cp.empty(max(t.flush_bytes, 1), dtype=cp.uint8)
    stream = cp.cuda.get_current_stream()
    pairs = []
    t0 = be.now()
    first = cp.cuda.Event()
    first.record(stream)
    for i in range(t.calls):
        for which, fn in (("b", fn_baseline), ("c", fn_kernel)):
            flush.fill((i * 2 + (which == "c")) & 0xFF)
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            fn()
            end.record(stream)
            pairs.append((which, start, end))
    last = cp.cuda.Event()
    last.record(stream)
    last.synchronize()
    t_stream = be.now()
    be.sync()
    t_dev = be.now()
    out = TrialTimes()
    for which, start, end in pairs:
        ms = cp.cuda.get_elapsed_time(start, end)
        (out.baseline_ms if which == "b" else out.kernel_ms).append(ms)
    out.wall_ms = (t_dev - t0) * 1e3
    out.span_ms = cp.cuda.get_elapsed_time(first, last)
    out.leftover_ms = (t_dev - t_stream) * 1e3
    slack = t.wall_mismatch_slack_ms
    if out.leftover_ms > slack:
        out.flag = (f"device work outlived the timed stream by {out.leftover_ms:.1f} ms "
                    "(work on another stream the events did not time)")
    elif out.wall_ms > t.wall_mismatch_ratio * out.span_ms + slack:
        out.flag = (f"wall clock {out.wall_ms:.1f} ms vs event span {out.span_ms:.1f} ms: "
                    "the events missed part of the work")
    return out


def _cpu_trial(be: Backend, t: Timing, fn_baseline, fn_kernel) -> TrialTimes:
    import numpy as np

    flush = np.empty(max(t.flush_bytes, 1), dtype=np.uint8)
    out = TrialTimes()
    t0 = be.now()
    for i in range(t.calls):
        for which, fn in (("b", fn_baseline), ("c", fn_kernel)):
            flush.fill((i * 2 + (which == "c")) & 0xFF)
            start = be.now()
            fn()
            ms = (be.now() - start) * 1e3
            (out.baseline_ms if which == "b" else out.kernel_ms).append(ms)
    out.wall_ms = out.span_ms = (be.now() - t0) * 1e3
    return out


def summarise(trials: list[TrialTimes]) -> dict:
    b = [tr.baseline_median for tr in trials]
    k = [tr.kernel_median for tr in trials]
    b_mean, k_mean = statistics.fmean(b), statistics.fmean(k)
    return {
        "baseline_ms": b_mean,
        "kernel_ms": k_mean,
        "speedup": b_mean / k_mean if k_mean > 0 else float("inf"),
        "spread": {
            "baseline": (max(b) - min(b)) / b_mean if b_mean > 0 else 0.0,
            "kernel": (max(k) - min(k)) / k_mean if k_mean > 0 else 0.0,
        },
        "trials": [
            {"baseline_ms": tr.baseline_median, "kernel_ms": tr.kernel_median, "wall_ms": tr.wall_ms,
             "span_ms": tr.span_ms, "leftover_ms": tr.leftover_ms, "flag": tr.flag}
            for tr in trials
        ],
    }

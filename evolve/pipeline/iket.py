"""The iket stage (optional): an in-kernel event trace of the candidate; records a
per-warp, per-stage summary of the timeline."""
from __future__ import annotations

import json
import math
import re
from collections.abc import Generator, Iterator
from typing import Any

from kcoral.remote import SendSpec, run_iket

from evolve.pipeline.context import StageContext
from evolve.pipeline.crash import exception_line, last_traceback
from evolve.pipeline.timings import node_metric, outcome_fields
from evolve.population import Candidate, StageLogs, StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage

# The candidate writes the buffer, so its trace is hostile: each is refused past this size
# before it is read, and what is stored is capped, so one row stays small (measured before:
# 600k records took 1.7 GiB of orchestrator memory and 28 MB of metrics). The size holds a
# full buffer of the templates' default capacity (iket_host.py: 2^18 records; the converter
# writes ~110 bytes a record, ~285 with a new warp each: 75 MB at most).
MAX_TRACE_BYTES = 96 << 20
MAX_TRACES_BYTES = 256 << 20  # what the server may send at all: it refuses beyond
MAX_STAGE_KEYS = 256   # warp x stage keys stored per trace; the busiest are kept
MAX_TRACES = 16        # traces (kernels) summarised per candidate
MAX_NAME_CHARS = 120   # of a stored key or trace name (the meta's names are the candidate's)
MAX_PERIOD_SERIES = 1 << 16   # (CTA, warp x stage) series followed for a period; the rest are not


class TraceRefused(ValueError):
    """A trace the stage will not summarise; the message says why."""


def _no_constant(name: str) -> float:
    raise TraceRefused(f"the trace holds {name}, not a number")  # NaN is no JSON for PostgreSQL


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, i: int) -> int:
    m = _SPACE.match(text, i)
    return m.end() if m else i


def _expect(text: str, i: int, chars: str) -> str:
    if i >= len(text) or text[i] not in chars:
        raise TraceRefused(f"malformed trace JSON at offset {i}: expected one of {chars!r}")
    return text[i]


def _array(text: str, i: int) -> Generator[Any, None, int]:
    """The elements of the array at text[i] ('['), decoded one at a time; returns the offset past it."""
    i = _skip(text, i + 1)
    if text.startswith("]", i):
        return i + 1
    while True:
        value, i = _DECODER.raw_decode(text, i)
        yield value
        i = _skip(text, i)
        sep = _expect(text, i, ",]")
        i = _skip(text, i + 1)
        if sep == "]":
            return i


def _events(text: str) -> Iterator[Any]:
    """The events of a Chrome trace (a bare array, or an object's "traceEvents"), decoded one
    at a time: the orchestrator holds the text and one event, never the whole document (a
    json.loads of a 54 MB trace took 400 MiB)."""
    i = _skip(text, 0)
    if _expect(text, i, "[{") == "[":
        i = yield from _array(text, i)
    else:
        i = _skip(text, i + 1)
        if text.startswith("}", i):
            i += 1
        else:
            while True:
                key, i = _DECODER.raw_decode(text, i)
                if not isinstance(key, str):
                    raise TraceRefused(f"malformed trace JSON at offset {i}: a key is no string")
                i = _skip(text, i)
                _expect(text, i, ":")
                i = _skip(text, i + 1)
                if key == "traceEvents" and text.startswith("[", i):
                    i = yield from _array(text, i)
                else:
                    _, i = _DECODER.raw_decode(text, i)
                i = _skip(text, i)
                sep = _expect(text, i, ",}")
                i = _skip(text, i + 1)
                if sep == "}":
                    break
    if _skip(text, i) != len(text):
        raise TraceRefused(f"malformed trace JSON: extra data at offset {i}")


def _finite(value: Any, what: str) -> float:
    x = float(value)
    if not math.isfinite(x):
        raise TraceRefused(f"the trace's {what} is {value!r}, not a finite number")
    return x


def summarise(trace: bytes) -> dict:
    """Per (warp, stage name): count and mean duration (µs) from a Chrome trace, and where a
    warp records the stage again and again in a CTA (a chunk loop), its period: the mean time
    from one start to the next, (last start - first start) / (count - 1) per CTA, averaged over
    the CTAs. At most MAX_STAGE_KEYS keys (those with the most events), `stages_left_out`
    counting the rest. Raises TraceRefused for a trace over MAX_TRACE_BYTES (before reading
    it) or one it cannot read."""
    if len(trace) > MAX_TRACE_BYTES:
        raise TraceRefused(f"the trace is {len(trace)} bytes, over the limit of {MAX_TRACE_BYTES}")
    sums: dict[str, list[float]] = {}   # key -> [count, total µs]: memory by keys, not events
    series: dict[tuple[str, str], list[float]] = {}   # (CTA, key) -> [count, first start, last start]
    lo, hi = math.inf, -math.inf
    try:
        for ev in _events(trace.decode("utf-8")):
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            key = f"w{ev.get('tid')}:{ev.get('name')}"[:MAX_NAME_CHARS]
            dur, ts = _finite(ev.get("dur", 0), "dur"), _finite(ev.get("ts", 0), "ts")
            acc = sums.setdefault(key, [0, 0.0])
            acc[0] += 1
            acc[1] += dur
            lo, hi = min(lo, ts), max(hi, ts + dur)
            cta = str(ev.get("pid"))[:MAX_NAME_CHARS]
            run = series.get((cta, key))
            if run is not None:
                run[0] += 1
                run[1], run[2] = min(run[1], ts), max(run[2], ts)
            elif len(series) < MAX_PERIOD_SERIES:
                series[(cta, key)] = [1, ts, ts]
    except TraceRefused:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # bad UTF-8 or JSON, a non-number
        raise TraceRefused(f"unreadable trace: {type(exc).__name__}: {str(exc)[:200]}") from None
    kept = sorted(sorted(sums.items()), key=lambda kv: -kv[1][0])[:MAX_STAGE_KEYS]
    stages: dict[str, dict[str, Any]] = {k: {"count": int(n), "mean_us": _rounded(total / n)}
                                         for k, (n, total) in sorted(kept)}
    periods: dict[str, list[float]] = {}
    for (_, key), (n, first, last) in series.items():
        if n >= 3 and key in stages:   # two gaps at least: one is a single interval, not a loop
            periods.setdefault(key, []).append((last - first) / (n - 1))
    for key, values in periods.items():
        stages[key]["period_us"] = _rounded(math.fsum(values) / len(values))
    out: dict[str, Any] = {"stages": stages, "span_us": _rounded(hi - lo) if sums else None}
    if len(sums) > len(kept):
        out["stages_left_out"] = len(sums) - len(kept)
    return out


def _rounded(x: float) -> float:
    if not math.isfinite(x):  # finite inputs can still overflow a sum
        raise TraceRefused("the trace's times overflow")
    return round(x, 3)  # µs to the nanosecond, no float noise in the stored row


def run(ctx: StageContext, cand: Candidate) -> StageResult:
    cfg = ctx.stages[Stage.IKET]
    directory = ctx.candidate_dir(cand)
    if cfg.app and cfg.app[-1].endswith(".py") and not (directory / cfg.app[-1]).is_file():
        return StageResult(status=EvaluationStatus.FAILED, failure_kind=FailureKind.CHECK,
                           message=f"iket stage: the candidate has no {cfg.app[-1]}")
    # No raw buffer/meta pair: only the converted trace is read here, and the raw pair would
    # double what comes back.
    with ctx.gate.slot(ctx.cancel):
        res = run_iket(ctx.client, sends=[SendSpec(directory)], app=list(cfg.app), env={}, timeout=cfg.timeout,
                       include_raw=False, files_cap=MAX_TRACES_BYTES)
    timing = outcome_fields(res.outcome)
    crash = last_traceback(res.stderr or "")
    logs = StageLogs(stdout=getattr(res, "stdout", "") or "", stderr=res.stderr or "", traceback=crash or "")
    if res.exit_code != 0 or not res.traces:
        why = "; ".join(f"{k}: {v}" for k, v in res.errors.items()) or res.stderr[-2000:] or "no trace returned"
        kind = FailureKind.TIMEOUT if res.timed_out else FailureKind.RUNTIME
        return StageResult(status=EvaluationStatus.FAILED, failure_kind=kind,
                           message=(f"{exception_line(crash)}\n" if crash else "") + f"iket exit {res.exit_code}: {why}"[:4000],
                           logs=logs, **timing)
    names = sorted(res.traces)
    summary: dict[str, Any] = {}
    for name in names[:MAX_TRACES]:
        try:
            summary[name[:MAX_NAME_CHARS]] = summarise(res.traces[name])
        except TraceRefused as exc:
            # The app's output, not the server: a runtime failure of the candidate.
            return StageResult(status=EvaluationStatus.FAILED, failure_kind=FailureKind.RUNTIME,
                               message=f"iket trace {name[:MAX_NAME_CHARS]!r} refused: {exc}"[:4000],
                               logs=logs, **timing)
    metrics: dict[str, Any] = {"traces": summary, **node_metric(res.outcome)}
    if len(names) > MAX_TRACES:
        metrics["traces_left_out"] = len(names) - MAX_TRACES
    return StageResult(status=EvaluationStatus.PASSED, metrics=metrics, logs=logs, **timing)

"""IKET (in-kernel event tracing): raw buffer + meta -> Chrome trace JSON, and the
analyzer behind ``kcoral iket-analyze``.

Standard library only: the remote tool runner ships this very file to the server and
converts traces there (see ``kcoral.runners``), so there is one implementation.

Buffer layout (little-endian, written by the host after a traced launch)::

    uint64 capacity; uint64 count; IketRecord records[capacity]
    struct IketRecord { uint32 cta, warp, stage, seq; uint64 start_ns, end_ns; }  // 32 bytes

``count`` keeps growing past ``capacity`` when the buffer overflows; the records beyond
capacity are lost and reported as ``dropped``.
"""
from __future__ import annotations

import contextlib
import gc
import json
import statistics
import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

HEADER = struct.Struct("<QQ")
RECORD = struct.Struct("<IIIIQQ")
TRACE_SUFFIX = ".trace.json"
BIN_SUFFIX = ".iket.bin"
META_SUFFIX = ".iket.json"


class IketError(ValueError):
    """A buffer, meta document or trace that cannot be read; the message says why."""


class IketRecord(NamedTuple):
    cta: int
    warp: int
    stage: int
    seq: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class IketBuffer:
    capacity: int
    count: int
    records: list[IketRecord]

    @property
    def dropped(self) -> int:
        return max(0, self.count - self.capacity)


def parse_buffer(data: bytes) -> IketBuffer:
    """Decode a raw IKET buffer; refuses a buffer shorter than its own records."""
    if len(data) < HEADER.size:
        raise IketError(f"IKET buffer of {len(data)} bytes is shorter than its 16-byte header")
    capacity, count = HEADER.unpack_from(data, 0)
    used = min(capacity, count)
    need = HEADER.size + used * RECORD.size
    if len(data) < need:
        raise IketError(f"IKET buffer truncated: {used} records need {need} bytes, "
                        f"got {len(data)}")
    view = memoryview(data)[HEADER.size:need]
    records = list(map(IketRecord._make, RECORD.iter_unpack(view)))
    return IketBuffer(capacity=capacity, count=count, records=records)


def pack_buffer(records: list[IketRecord], capacity: int | None = None,
                count: int | None = None) -> bytes:
    """Encode records in the device layout (used by fixtures and host-side tests)."""
    capacity = len(records) if capacity is None else capacity
    if capacity < len(records):
        raise IketError("capacity is smaller than the number of records")
    count = len(records) if count is None else count
    out = bytearray(HEADER.pack(capacity, count))
    for r in records:
        out += RECORD.pack(r.cta, r.warp, r.stage, r.seq, r.start_ns, r.end_ns)
    out += bytes(RECORD.size * (capacity - len(records)))
    return bytes(out)


def parse_meta(data: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """Validate the meta document: kernel, stages {id: name}, warp_roles, chunk_stage."""
    if isinstance(data, (bytes, str)):
        try:
            meta = json.loads(data)
        except ValueError as exc:
            raise IketError(f"IKET meta is not JSON: {exc}") from None
    else:
        meta = data
    if not isinstance(meta, dict):
        raise IketError("IKET meta must be a JSON object")
    kernel = meta.get("kernel")
    if not isinstance(kernel, str) or not kernel:
        raise IketError("IKET meta needs a non-empty string 'kernel'")
    stages = meta.get("stages", {})
    roles = meta.get("warp_roles", {})
    for label, table in (("stages", stages), ("warp_roles", roles)):
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and k.isdigit() and isinstance(v, str) for k, v in table.items()
        ):
            raise IketError(f"IKET meta '{label}' must map decimal ids to names")
    chunk = meta.get("chunk_stage")
    if chunk is not None and not isinstance(chunk, str):
        raise IketError("IKET meta 'chunk_stage' must be a stage name")
    return {"kernel": kernel, "stages": dict(stages), "warp_roles": dict(roles),
            "chunk_stage": chunk}


@contextlib.contextmanager
def _gc_paused():
    # Hundreds of thousands of small dicts trigger repeated full collections (measured:
    # twice the time at 200k records); nothing built here forms reference cycles.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def to_chrome_trace(buffer: bytes | IketBuffer, meta: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """Build a Chrome trace: one complete ("X") event per record, ``pid`` = CTA,
    ``tid`` = warp, ``ts``/``dur`` in µs from the earliest start; metadata events name
    processes ("CTA n") and threads ("warp w (role)")."""
    with _gc_paused():
        return _to_chrome_trace(buffer, meta)


def _to_chrome_trace(buffer: bytes | IketBuffer, meta: bytes | str | dict[str, Any]) -> dict[str, Any]:
    buf = parse_buffer(buffer) if isinstance(buffer, (bytes, bytearray, memoryview)) else buffer
    info = parse_meta(meta)
    stages: dict[str, str] = info["stages"]
    roles: dict[str, str] = info["warp_roles"]
    records = sorted(buf.records, key=lambda r: (r[4], r[0], r[1], r[3]))
    t0 = records[0].start_ns if records else 0
    events: list[dict[str, Any]] = []
    ctas = sorted({r.cta for r in records})
    threads = sorted({(r.cta, r.warp) for r in records})
    for cta in ctas:
        events.append({"name": "process_name", "ph": "M", "pid": cta, "tid": 0,
                       "args": {"name": f"CTA {cta}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": cta, "tid": 0,
                       "args": {"sort_index": cta}})
    for cta, warp in threads:
        role = roles.get(str(warp))
        label = f"warp {warp} ({role})" if role else f"warp {warp}"
        events.append({"name": "thread_name", "ph": "M", "pid": cta, "tid": warp,
                       "args": {"name": label}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": cta, "tid": warp,
                       "args": {"sort_index": warp}})
    bad = 0
    names = {int(k): v for k, v in stages.items()}
    for cta, warp, stage, seq, start, end in records:
        if end < start:
            bad += 1  # a record cut by a trap or an unfinished stage; keep it visible
        name = names.get(stage)
        if name is None:
            name = names[stage] = f"stage{stage}"
        # ts/dur in µs (the Chrome trace unit); ns / 1000 keeps nanosecond resolution.
        events.append({
            "name": name, "cat": "iket", "ph": "X", "pid": cta, "tid": warp,
            "ts": (start - t0) / 1000, "dur": (end - start) / 1000 if end > start else 0.0,
            "args": {"stage": stage, "seq": seq},
        })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "kernel": info["kernel"], "stages": stages, "warp_roles": roles,
            "chunk_stage": info["chunk_stage"], "records": len(records),
            "capacity": buf.capacity, "count": buf.count, "dropped": buf.dropped,
            "negative_durations": bad, "t0_ns": t0, "time_unit": "us",
        },
    }


def convert_pair(bin_bytes: bytes, meta_bytes: bytes) -> bytes:
    """Raw buffer + meta -> UTF-8 Chrome trace JSON bytes."""
    with _gc_paused():
        trace = _to_chrome_trace(bin_bytes, meta_bytes)
        return json.dumps(trace, separators=(",", ":")).encode()


def find_pairs(filenames: list[str]) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """Match ``<kernel>.iket.bin`` with ``<kernel>.iket.json`` by name.

    Returns ({kernel: (bin name, meta name)}, [names left without their partner]).
    """
    names = set(filenames)
    pairs: dict[str, tuple[str, str]] = {}
    lonely: list[str] = []
    for name in sorted(names):
        if name.endswith(BIN_SUFFIX):
            kernel = name[: -len(BIN_SUFFIX)]
            meta = kernel + META_SUFFIX
            if meta in names:
                pairs[kernel] = (name, meta)
            else:
                lonely.append(name)
        elif name.endswith(META_SUFFIX) and name[: -len(META_SUFFIX)] + BIN_SUFFIX not in names:
            lonely.append(name)
    return pairs, lonely


# ---------------------------------------------------------------------------- analyzer


@dataclass
class StageStats:
    stage: str
    mean_us: float
    median_us: float
    count: int


@dataclass
class WarpStats:
    warp: int
    role: str | None
    stages: list[StageStats] = field(default_factory=list)


@dataclass
class ChunkPeriod:
    stage: str
    mean_us: float
    median_us: float
    intervals: int


@dataclass
class TraceAnalysis:
    kernel: str | None
    cta: int | None  # None: every CTA pooled
    kernel_span_us: float
    cta_span_us: float | None  # the chosen CTA's span, else the worst CTA's
    worst_cta: int | None
    warps: list[WarpStats]
    chunk_period: ChunkPeriod | None
    dropped: int

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _steady_intervals(starts: list[float]) -> list[float]:
    # Start-to-start gaps of one warp's chunk loop; the first and last tenth (at least one
    # gap each once there are five) are pipeline fill and drain, not the steady state.
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    if len(gaps) >= 5:
        trim = max(1, len(gaps) // 10)
        gaps = gaps[trim: len(gaps) - trim]
    return gaps


def analyze_trace(trace: dict[str, Any], cta: int | None = None) -> TraceAnalysis:
    """Per warp and stage: mean, median and count of durations (µs); the kernel span;
    the span of ``cta`` (or the worst CTA); the steady-state period of the chunk loop."""
    with _gc_paused():
        return _analyze_trace(trace, cta)


def _analyze_trace(trace: object, cta: int | None = None) -> TraceAnalysis:
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise IketError("not a Chrome trace: no 'traceEvents' list")
    other_data = trace.get("otherData")
    other: dict[str, Any] = other_data if isinstance(other_data, dict) else {}
    roles: dict[int, str] = {}
    for k, v in (other.get("warp_roles") or {}).items():
        if str(k).isdigit():
            roles[int(k)] = str(v)
    spans: list[tuple[int, int, str, float, float]] = []  # cta, warp, stage, ts, dur
    for ev in trace["traceEvents"]:
        if not isinstance(ev, dict):
            continue
        if ev.get("ph") == "X":
            try:
                spans.append((int(ev["pid"]), int(ev["tid"]), str(ev["name"]),
                              float(ev["ts"]), float(ev.get("dur", 0.0))))
            except (KeyError, TypeError, ValueError):
                raise IketError(f"malformed trace event: {ev!r}") from None
    if not spans:
        raise IketError("the trace holds no events")
    per_cta: dict[int, tuple[float, float]] = {}
    for c, _, _, ts, dur in spans:
        lo, hi = per_cta.get(c, (ts, ts + dur))
        per_cta[c] = (min(lo, ts), max(hi, ts + dur))
    kernel_span = max(h for _, h in per_cta.values()) - min(lo for lo, _ in per_cta.values())
    if cta is not None:
        if cta not in per_cta:
            raise IketError(f"CTA {cta} is not in the trace (CTAs {min(per_cta)}..{max(per_cta)})")
        spans = [s for s in spans if s[0] == cta]
        cta_span = per_cta[cta][1] - per_cta[cta][0]
        worst = cta
    else:
        worst = max(per_cta, key=lambda c: per_cta[c][1] - per_cta[c][0])
        cta_span = per_cta[worst][1] - per_cta[worst][0]
    by_warp: dict[int, dict[str, list[float]]] = {}
    order: dict[str, int] = {}
    for _, w, name, _, dur in sorted(spans, key=lambda s: (s[3], s[1])):
        order.setdefault(name, len(order))
        by_warp.setdefault(w, {}).setdefault(name, []).append(dur)
    warps = []
    for w in sorted(by_warp):
        stats = [StageStats(stage=name, mean_us=statistics.fmean(d),
                            median_us=statistics.median(d), count=len(d))
                 for name, d in sorted(by_warp[w].items(), key=lambda kv: order[kv[0]])]
        warps.append(WarpStats(warp=w, role=roles.get(w), stages=stats))
    period = None
    chunk_stage = other.get("chunk_stage")
    if chunk_stage:
        series: dict[tuple[int, int], list[float]] = {}
        for c, w, name, ts, _ in spans:
            if name == chunk_stage:
                series.setdefault((c, w), []).append(ts)
        gaps: list[float] = []
        for starts in series.values():
            gaps.extend(_steady_intervals(sorted(starts)))
        if gaps:
            period = ChunkPeriod(stage=chunk_stage, mean_us=statistics.fmean(gaps),
                                 median_us=statistics.median(gaps), intervals=len(gaps))
    return TraceAnalysis(kernel=other.get("kernel"), cta=cta, kernel_span_us=kernel_span,
                         cta_span_us=cta_span, worst_cta=worst, warps=warps,
                         chunk_period=period, dropped=int(other.get("dropped") or 0))


def format_analysis(a: TraceAnalysis) -> str:
    """Text in the style agents read: one block per warp, one line per stage."""
    lines = []
    if a.kernel:
        lines.append(f"kernel {a.kernel}")
    lines.append(f"kernel span {a.kernel_span_us:.1f} us")
    if a.cta is not None:
        lines.append(f"CTA {a.cta} span {a.cta_span_us:.1f} us")
    elif a.worst_cta is not None:
        lines.append(f"worst CTA {a.worst_cta} span {a.cta_span_us:.1f} us")
    if a.dropped:
        lines.append(f"WARNING: {a.dropped} records were dropped (IKET buffer overflow)")
    width = max((len(s.stage) for w in a.warps for s in w.stages), default=8)
    for w in a.warps:
        lines.append(f"-- warp {w.warp}" + (f" ({w.role})" if w.role else ""))
        for s in w.stages:
            lines.append(f"  {s.stage:<{width}} mean {s.mean_us:.3f} med {s.median_us:.3f} "
                         f"[{s.count}]")
    if a.chunk_period is not None:
        p = a.chunk_period
        lines.append(f"steady-state chunk period ({p.stage}) mean {p.mean_us:.3f} us "
                     f"med {p.median_us:.3f} us [{p.intervals} intervals]")
    else:
        lines.append("steady-state chunk period: n/a (no chunk_stage events)")
    return "\n".join(lines)

"""Calls of a candidate, judge side: a `Session` is one `setup` of one host at one length T,
on memory the host made and the judge maps; `Session.batch` runs a batch of calls on fresh
inputs and returns what the judge saw of it.

Every call of every batch is alike, whether its time counts or not: inside its window the
judge writes its new inputs into the session's memory, poisons its outputs and flushes the
cache with a buffer of its own; the host runs the call and answers; the judge snapshots the
outputs into memory of its own. Verification reads only that snapshot and inputs the judge
regenerates from their seeds, so a host that keeps working after it answered, or edits its
inputs, fails its check. The host does nothing per call but the call and its timer, so
there is no step of the protocol a candidate could skip to make room in the judge's clock
(see memory.py)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeGuard

from . import cpuclock
from .backend import BF16, Backend, bits_view, poison, write_into
from .compare import check_output
from .harness import CandidateError
from .hostproc import HostProcess
from .inputs import INPUT_NAMES
from .memory import Arena, Buffer, HostMemoryError, plan_bytes
from .reference import chunked_f32, recurrence_f64
from .spec import WorkloadSpec

Inputs = dict  # name -> array, as inputs.py makes them
MakeInputs = Callable[..., Inputs]  # regenerates one call's inputs from its seed (bound as lambda defaults)


def input_layout(spec: WorkloadSpec, T: int) -> list[tuple[str, tuple[int, ...], object]]:
    B, H, K, V = spec.B, spec.H, spec.K, spec.V
    f32 = "float32"
    return [("q", (B, T, H, K), BF16), ("k", (B, T, H, K), BF16), ("v", (B, T, H, V), BF16),
            ("g", (B, T, H, K), BF16), ("beta", (B, T, H), BF16), ("A_log", (H,), f32),
            ("dt_bias", (H * K,), f32), ("initial_state", (B, H, V, K), f32)]


def output_layout(spec: WorkloadSpec, T: int) -> list[tuple[str, tuple[int, ...], object]]:
    return [("output", (spec.B, T, spec.H, spec.V), BF16), ("final_state", (spec.B, spec.H, spec.V, spec.K), "float32")]


def _place(arena: Arena, host: HostProcess, sid: int, layouts: list[list[tuple[str, tuple, object]]]
           ) -> tuple[Buffer, list[tuple[dict[str, Any], dict[str, dict]]]]:
    """The host makes one buffer holding every layout, each as a contiguous block, and the
    judge maps it; returns (buffer, [(arrays, descriptors)])."""
    flat = [(shape, dt) for layout in layouts for _, shape, dt in layout]
    nbytes = plan_bytes(flat)
    reply, fds = host.request_fds({"op": "alloc", "session": sid, "nbytes": nbytes})
    try:
        buf = arena.adopt(sid, nbytes, reply, fds)
    except HostMemoryError as exc:
        raise CandidateError("runtime", f"the {host.label} process's memory was refused: {exc}") from None
    host.adopted.append(buf)
    out = []
    for layout in layouts:
        arrays: dict[str, Any] = {}
        descs: dict[str, dict] = {}
        for name, shape, dt in layout:
            arrays[name], descs[name] = buf.take(shape, dt)
        out.append((arrays, descs))
    return buf, out


@dataclass
class Batch:
    """What the judge saw of one batch: the host's own figures and the judge's clock."""

    snapshots: list[dict]  # per call: judge-private copies of output and final_state
    host_ms: list[float]
    wall_ms: float  # the judge's clock: the sum over calls of inputs written -> snapshot complete
    windows_ms: list[float] = field(default_factory=list)  # that clock per call, in call order
    cpu_clock: bool = False  # the host timed calls by CPU time (the CPU twin, see cpuclock.py)
    cpu_ms: float | None = None  # CPU time of every process the judge started, over the batch's
    #                              calls; None when it could not be read whole (tasks came or went)


class Session:
    def __init__(self, be: Backend, spec: WorkloadSpec, arena: Arena, host: HostProcess, T: int,
                 setup_inputs: Inputs, which: str = "candidate") -> None:
        self.be, self.spec, self.arena, self.host, self.T = be, spec, arena, host, T
        self.id = id(self)
        self.buf, [(self.inputs, in_desc), (self.outs, out_desc)] = _place(
            arena, host, self.id, [input_layout(spec, T), output_layout(spec, T)])
        for name in INPUT_NAMES:
            write_into(be.xp, self.inputs[name], setup_inputs[name])
        poison(be.xp, self.outs["output"])
        poison(be.xp, self.outs["final_state"])
        arena.flush(int(spec.timing.flush_bytes))  # made and written now, not in a window
        self.preroll = arena.preroll(spec.timing.preroll_ms)
        be.sync()
        host.request({"op": "setup", "session": self.id, "which": which, "B": spec.B, "T": T, "H": spec.H,
                      "scale": float(spec.scale), "inputs": in_desc,
                      "output": out_desc["output"], "final_state": out_desc["final_state"],
                      "preroll": self.preroll.handle})

    def batch(self, makers: list[MakeInputs], flush_bytes: int = 0) -> Batch:
        """The calls one at a time, each on inputs the host first sees inside its own window.

        Per call: its inputs are generated in the judge's memory (outside the clock), then
        the clock starts, they are written into the session's memory, the outputs are
        poisoned, the cache is flushed (`flush_bytes` of the judge's own memory written),
        the GPU pre-roll starts (preroll.py), the host runs the call, and its outputs are snapshot into judge-private memory the
        moment it answers; the clock stops there. A host can only work on a call's inputs
        inside that call's window, so the windows count all of its work."""
        be, xp = self.be, self.be.xp
        n = len(makers)
        snaps, ms, windows = [], [], []
        cpu = be.device == "cpu" and cpuclock.available()
        cpu_ms: float | None = 0.0
        whole = cpuclock.read() if cpu else None  # a task that came and went between calls voids it too
        for i, make in enumerate(makers):
            fresh = make()
            # The snapshot's memory is taken before the clock starts: growing the judge's
            # memory pool (a first batch's 33 x 200 MB) cost up to 5 ms a call inside it.
            private = {name: xp.empty_like(a) for name, a in self.outs.items()}
            be.sync()
            before = cpuclock.read() if cpu else None
            t0 = time.perf_counter()
            for name in INPUT_NAMES:
                write_into(xp, self.inputs[name], fresh[name])
            poison(xp, self.outs["output"])
            poison(xp, self.outs["final_state"])
            self.arena.flush(int(flush_bytes), tag=i + 1)
            be.sync()
            self.preroll.start()
            reply = self.host.request({"op": "call", "session": self.id, "clock": "cpu" if cpu else "wall"})
            for name, a in self.outs.items():
                private[name][...] = a
            be.sync()
            windows.append((time.perf_counter() - t0) * 1e3)
            if cpu_ms is not None and before is not None:
                spent = cpuclock.between(before, cpuclock.read())
                cpu_ms = None if spent is None else cpu_ms + spent
            del fresh
            snaps.append(private)
            x = reply.get("ms")
            ms.append(float(x) if _is_ms(x) else math.nan)  # unusable: only the judge's clock counts
        if whole is not None and cpuclock.between(whole, cpuclock.read()) is None:
            cpu_ms = None
        if not all(math.isfinite(x) for x in ms):
            ms = [math.nan] * n
        return Batch(snaps, ms, math.fsum(windows), windows, cpu, cpu_ms if cpu else None)

    def inputs_intact(self, last: Inputs) -> list[str]:
        """Names of the inputs the last call changed (they must be read-only to it); read
        while the host still lives."""
        xp = self.be.xp
        return [n for n in INPUT_NAMES if not bool((bits_view(xp, self.inputs[n]) == bits_view(xp, last[n])).all())]


def _is_ms(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def verify(be: Backend, spec: WorkloadSpec, snapshot: dict, inputs: Inputs, oracle: str, loose: bool) -> dict:
    """One call's snapshot against the reference for exactly its inputs."""
    xp = be.xp
    if oracle == "f64":
        ref_out, ref_state = recurrence_f64(xp, inputs, spec.scale, spec.gate_floor, spec.norm_eps)
    else:
        ref_out, ref_state = chunked_f32(xp, inputs, spec.scale, spec.gate_floor, spec.norm_eps, spec.chunk)
    tol = spec.loose_tolerance if loose else spec.tolerance
    problems, rms = [], {}
    for name, ref in (("output", ref_out), ("final_state", ref_state)):
        v = check_output(xp, name, snapshot[name], ref, tol)
        rms[name] = v.rms_ratio if math.isfinite(v.rms_ratio) else None
        if not v.ok:
            problems.append(v.detail)
    return {"ok": not problems, "detail": "; ".join(problems), "rms": rms}


"""Calls of a candidate, judge side: a `Session` is one `setup` of one host at one length T,
on buffers the judge lends; `Session.batch` runs a batch of calls on fresh inputs and
returns what the judge saw of it.

Every call of every batch is alike, whether its time counts or not: its inputs are new
(rewritten into the buffers `setup` captured), its outputs are poisoned before it, and its
outputs are copied into a result slot that the judge snapshots, in an order drawn after
the batch, into memory of its own the moment the host answers. Verification reads only
that snapshot and inputs the judge regenerates from their seeds, so a host that keeps
working after it answered, or edits the lent inputs, fails its check."""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable

from . import cpuclock
from .backend import BF16, Backend, bits_view, poison, write_into
from .compare import check_output
from .hostproc import HostProcess
from .inputs import INPUT_NAMES
from .memory import Arena, place, plan_bytes
from .reference import chunked_f32, recurrence_f64
from .spec import WorkloadSpec

Inputs = dict  # name -> array, as inputs.py makes them
MakeInputs = Callable[[], Inputs]  # regenerates one call's inputs from its seed


def input_layout(spec: WorkloadSpec, T: int) -> list[tuple[str, tuple[int, ...], object]]:
    B, H, K, V = spec.B, spec.H, spec.K, spec.V
    f32 = "float32"
    return [("q", (B, T, H, K), BF16), ("k", (B, T, H, K), BF16), ("v", (B, T, H, V), BF16),
            ("g", (B, T, H, K), BF16), ("beta", (B, T, H), BF16), ("A_log", (H,), f32),
            ("dt_bias", (H * K,), f32), ("initial_state", (B, H, V, K), f32)]


def output_layout(spec: WorkloadSpec, T: int) -> list[tuple[str, tuple[int, ...], object]]:
    return [("output", (spec.B, T, spec.H, spec.V), BF16), ("final_state", (spec.B, spec.H, spec.V, spec.K), "float32")]


def _lend(arena: Arena, layouts: list[list[tuple[str, tuple, object]]]):
    """One fresh buffer holding every layout, each as a contiguous block; returns (buffer,
    [(arrays, descriptors, block descriptor)]). Blocks of one layout have one size, so a host moves a
    whole set of inputs (or outputs) with one copy."""
    flat = [(shape, dt) for layout in layouts for _, shape, dt in layout]
    buf = arena.buffer(plan_bytes(flat))
    out = []
    for layout in layouts:
        arrays, descs = {}, {}
        for name, shape, dt in layout:
            arrays[name], descs[name] = buf.take(shape, dt)
        start = out[-1][2]["offset"] + out[-1][2]["shape"][0] if out else 0
        out.append((arrays, descs, {"buf": buf.id, "offset": start, "shape": [buf._used - start], "dtype": "uint8"}))
    return buf, out


def _block(buf, desc: dict):
    off = desc["offset"]
    return buf.base[off:off + desc["shape"][0]]


@dataclass
class Batch:
    """What the judge saw of one batch: the host's own figures and the judge's clock."""

    snapshots: list[dict]  # per call: views of judge-private copies of output and final_state
    host_ms: list[float]
    wall_ms: float  # the judge's clock: request sent -> snapshot complete
    cpu_clock: bool = False  # the host timed calls by CPU time (the CPU twin, see cpuclock.py)
    cpu_ms: float | None = None  # CPU time of every process the judge started, over the batch;
    #                              None when it could not be read whole (tasks came or went)


class Session:
    def __init__(self, be: Backend, spec: WorkloadSpec, arena: Arena, host: HostProcess, T: int,
                 setup_inputs: Inputs, which: str = "candidate") -> None:
        self.be, self.spec, self.arena, self.host, self.T = be, spec, arena, host, T
        self.id = id(self)
        self.buf, [(self.inputs, in_desc, in_block), (self.outs, out_desc, out_block)] = _lend(
            arena, [input_layout(spec, T), output_layout(spec, T)])
        for name in INPUT_NAMES:
            write_into(be.xp, self.inputs[name], setup_inputs[name])
        poison(be.xp, self.outs["output"])
        poison(be.xp, self.outs["final_state"])
        be.sync()
        host.lent.append(self.buf)
        host.request({"op": "setup", "session": self.id, "which": which, "B": spec.B, "T": T, "H": spec.H,
                      "scale": float(spec.scale), "buffers": [self.buf.info()], "inputs": in_desc,
                      "output": out_desc["output"], "final_state": out_desc["final_state"],
                      "input_block": in_block, "output_block": out_block,
                      "flush_bytes": int(spec.timing.flush_bytes)},
                     fds=[self.buf.fd] if self.buf.fd is not None else [])

    def batch(self, makers: list[MakeInputs], flush_bytes: int = 0) -> Batch:
        be, spec, xp = self.be, self.spec, self.be.xp
        n = len(makers)
        buf, parts = _lend(self.arena, [input_layout(spec, self.T)] * n + [output_layout(spec, self.T)] * n)
        sets, results = parts[:n], parts[n:]
        for (arrays, _, _), make in zip(sets, makers):
            fresh = make()
            for name in INPUT_NAMES:
                write_into(xp, arrays[name], fresh[name])
            del fresh
        for arrays, _, _ in results:
            poison(xp, arrays["output"])
            poison(xp, arrays["final_state"])
        private = [xp.empty(block["shape"][0], dtype=xp.uint8) for _, _, block in results]
        order = list(range(n))
        random.SystemRandom().shuffle(order)  # drawn now, unknown to the host
        be.sync()
        cpu = be.device == "cpu" and cpuclock.available()
        before = cpuclock.read() if cpu else None
        t0 = time.perf_counter()
        try:
            reply = self.host.request(
                {"op": "calls", "session": self.id, "buffers": [buf.info()], "flush_bytes": int(flush_bytes),
                 "sets": [block for _, _, block in sets], "results": [block for _, _, block in results],
                 "clock": "cpu" if cpu else "wall"},
                fds=[buf.fd] if buf.fd is not None else [])
            for i in order:
                private[i][...] = _block(buf, results[i][2])
            be.sync()
            wall = (time.perf_counter() - t0) * 1e3
            cpu_ms = cpuclock.between(before, cpuclock.read()) if before is not None else None
        finally:
            self.host.retire(buf)
        snaps = [_split(p, descs, block["offset"]) for p, (_, descs, block) in zip(private, results)]
        ms = reply.get("ms")
        if not isinstance(ms, list) or len(ms) != n or not all(_is_ms(x) for x in ms):
            ms = [math.nan] * n  # the host's figures are unusable: only the judge's clock counts
        return Batch(snaps, [float(x) for x in ms], wall, cpu, cpu_ms)

    def inputs_intact(self, last: Inputs) -> list[str]:
        """Names of the lent inputs the last call changed (they must be read-only to it)."""
        xp = self.be.xp
        return [n for n in INPUT_NAMES if not bool((bits_view(xp, self.inputs[n]) == bits_view(xp, last[n])).all())]


def _split(private, descs: dict, block_offset: int) -> dict:
    """Views of a private copy of a result block, placed as its descriptors place them."""
    return {name: place(private, d, block_offset) for name, d in descs.items()}


def _is_ms(x) -> bool:
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


#!/usr/bin/env python3
"""Where does a multi-stream candidate's extra time go under the KDA judge's protocol?

On the H200 every two_pass point with `segments > 1` (side streams) benched at 3.0-3.4 ms
by the judge's own per-call clock while its CUDA events read about 0.85 ms, and single-stream
points agree with their events within 2 % (docs/benchmarks.md, eighteenth session). The
suspect is the hand-off between the judge's process (its pre-roll spin) and the host's.
Answered on the H200 (docs/benchmarks.md, nineteenth session): the judge's spin was held off
the GPU for a time slice (2.5 ms became 4.5) whenever side streams waited on the pre-roll only
through the candidate's own event; `allwait` (every stream waits on it) removed it, and the
judge's host now does that for every CuPy stream a candidate makes (judge/preroll.py).

A two-process replica of judge/calls.py (window), judge/preroll.py (spin + interprocess
event) and judge/host.py (wait on the current stream, CUDA events, device sync, answer),
with %globaltimer stamps written from both contexts: one GPU clock for both processes, so
the window can be cut into
    spin     the judge's pre-roll as the spin itself saw it (2.5 ms unless held off the GPU)
    gap      spin end -> the judge's first GPU op after the answer, less the host's events
             (judge-side stamps only: nothing added to the host's streams)
    handoff  spin end -> the host's first GPU op after its wait  (not in the host's events)
    work     the host's first stamp -> its last stamp             (~ the host's events)
    tail     the host's last stamp -> the judge's first GPU op after the answer
and on the CPU clock (perf_counter, CLOCK_MONOTONIC, shared by both processes):
    msg      the judge sends the call -> the host has it
    hostbusy the host has it -> its device sync returned (wait, launches, the GPU's work)
    reply    the host's sync returned -> the judge has the answer
and compared between a no-op, a single-stream and the multi-stream candidate.

Run on a GPU host (CuPy needed), with candidate folders rendered by
    python -m evolve render two_pass segments=1 stages=3 walk_loads=cp_async --out P1
    python -m evolve render two_pass segments=4 stages=3 walk_loads=cp_async --out P4
then (P = python benchmarks/judge_handoff_probe.py)
    P P1/<hash> P4/<hash>                       # ~40 s
    P P4/<hash> --variants none prio0 blocking allwait ownstream cpuwait
    P P4/<hash> --preroll 0 0.5 1 2.5 5         # does the extra follow the spin?
    P P1/<hash> P4/<hash> --inproc              # one process, spin on the caller
Folders are candidate directories (the one holding solution.py); "syn:K" is a synthetic fn
of 0.4 ms forked onto K side streams the way the template forks (syn:0: one stream), to see
whether the extra grows with the number of side streams. "noop" is always run first (the
judge's protocol cost) and subtracted, as timing.py does with medians.
    P syn:0 syn:1 syn:2 syn:3 --stamps off      # ~30 s
    P syn:2 syn:2:late --stamps off             # fork after a first kernel
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import multiprocessing as mp
import statistics
import time
from pathlib import Path

import numpy as np

SRC = r"""
extern "C" __global__ void stamp(unsigned long long* out, int i) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[i] = t;
}
extern "C" __global__ void spin(unsigned long long ns, unsigned long long* out, int i) {
    unsigned long long s, n;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(s));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n)); } while (n - s < ns);
    out[i] = s; out[i + 1] = n;
}
extern "C" __global__ void busy(unsigned long long ns) {  // every block spins ns (synthetic work)
    unsigned long long s, n;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(s));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n)); } while (n - s < ns);
}
"""
B, T, H = 1, 8192, 96


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_fn(cand: str):
    """fn of a rendered candidate on random inputs at the scored shape (or a no-op)."""
    if cand == "noop":
        return lambda: None
    if cand.startswith("syn:"):  # K side streams forked from the caller as the template does
        import cupy as cp

        k = int(cand.split(":")[1])
        late = cand.endswith(":late")  # fork after a first kernel on the caller's stream
        busy = cp.RawModule(code=SRC).get_function("busy")
        ns = np.uint64(200_000)  # 0.2 ms a kernel
        side = [cp.cuda.Stream(non_blocking=True, priority=-1000 if j == k - 1 else 0) for j in range(k)]
        begun = cp.cuda.Event(disable_timing=True)
        done = [cp.cuda.Event(disable_timing=True) for _ in side]

        def syn():
            caller = cp.cuda.get_current_stream()
            if not side:  # syn:0, one stream
                busy((132,), (128,), (ns,))
                busy((132,), (128,), (ns,))
                return
            if late:
                busy((66,), (128,), (np.uint64(50_000),))
            begun.record(caller)
            for st, ev in zip(side, done):
                st.wait_event(begun)
                with st:
                    busy((66,), (128,), (ns,))
                    busy((66,), (128,), (ns,))
                ev.record(st)
            for ev in done:
                caller.wait_event(ev)

        syn()
        return syn
    d = Path(cand)
    launch = _load(d / "kda_launch.py", f"probe_launch_{abs(hash(cand))}")
    sol = _load(d / "solution.py", f"probe_sol_{abs(hash(cand))}")
    data = launch.random_inputs(B, T, H, seed=1)
    fn = sol.setup(data, B, T, H)
    fn._keep = data  # the raw pointers in fn point into these: they live as long as fn
    return fn


def host_main(conn, handle: str, cand: str, variant: str, calls: int, stamps_on: bool) -> None:
    """The candidate's host, as judge/host.py times a call (plus optional stamps)."""
    import cupy as cp

    made: list = []  # streams the candidate creates (variants change or wait on them)

    class Probed(cp.cuda.Stream):
        def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
            if variant == "prio0":
                priority = 0
            if variant == "blocking":
                non_blocking = False
            super().__init__(null=null, non_blocking=non_blocking, ptds=ptds, priority=priority)
            made.append(self)

    own = cp.cuda.Stream(non_blocking=True) if variant == "ownstream" else None
    cp.cuda.Stream = Probed  # before setup: the template makes its streams there
    ev = cp.cuda.runtime.ipcOpenEventHandle(bytes.fromhex(handle)) if handle else None
    stamp = cp.RawModule(code=SRC).get_function("stamp")
    st = cp.zeros(2 * calls, dtype=cp.uint64)
    fn = make_fn(cand)
    cp.cuda.Device().synchronize()
    conn.send("ready")
    for i in range(calls):
        conn.recv()
        got = time.perf_counter()  # CLOCK_MONOTONIC: one CPU clock for both processes
        with (own if own is not None else contextlib.nullcontext()):
            s = cp.cuda.get_current_stream()
            if ev is not None:
                if variant == "cpuwait":  # the CPU waits: no cross-context wait on the GPU
                    cp.cuda.runtime.eventSynchronize(ev)
                else:  # preroll.Waiter.wait
                    cp.cuda.runtime.streamWaitEvent(s.ptr, ev, 0)
                    if variant == "allwait":  # every stream the candidate made waits too
                        for x in made:
                            cp.cuda.runtime.streamWaitEvent(x.ptr, ev, 0)
            if stamps_on:  # a one-thread kernel on the caller's stream before the start event
                stamp((1,), (1,), (st, np.int32(2 * i)))
            a = cp.cuda.Event()
            a.record(s)
            fn()
            b = cp.cuda.Event()
            b.record(s)
            if stamps_on:
                stamp((1,), (1,), (st, np.int32(2 * i + 1)))
        cp.cuda.Device().synchronize()  # host._Timer.finish: Backend.sync
        conn.send((cp.cuda.get_elapsed_time(a, b), got, time.perf_counter()))
    conn.send(st.get().tolist())


def judge_run(cand: str, variant: str, preroll_ms: float, calls: int, warmup: int, stamps_on: bool,
              flush_mb: int) -> dict:
    """One batch as calls.Session.batch runs it (the input writes and the snapshot are
    replaced by the cache flush of the same size order)."""
    import cupy as cp

    mod = cp.RawModule(code=SRC)
    spin, stamp = mod.get_function("spin"), mod.get_function("stamp")
    ev = cp.cuda.Event(block=False, disable_timing=True, interprocess=True)
    handle = bytes(cp.cuda.runtime.ipcGetEventHandle(ev.ptr)).hex() if preroll_ms > 0 else ""
    n = warmup + calls
    js = cp.zeros(3 * n, dtype=cp.uint64)
    flush = cp.empty(flush_mb << 18, dtype=cp.uint32)
    flush.fill(0)
    spin((1,), (1,), (np.uint64(0), js, np.int32(0)))
    cp.cuda.Device().synchronize()
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=host_main, args=(theirs, handle, cand, variant, n, stamps_on))
    proc.start()
    assert ours.recv() == "ready"
    ns = int(preroll_ms * 1e6)
    windows, host, cpu = [], [], []
    for i in range(n):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        flush.fill(i + 1)
        cp.cuda.Device().synchronize()
        if ns:
            spin((1,), (1,), (np.uint64(ns), js, np.int32(3 * i)))
            ev.record()
        sent = time.perf_counter()
        ours.send("call")
        ms, got, synced = ours.recv()
        back = time.perf_counter()
        host.append(ms)
        cpu.append(((got - sent) * 1e3, (synced - got) * 1e3, (back - synced) * 1e3))
        stamp((1,), (1,), (js, np.int32(3 * i + 2)))  # the judge's first GPU op after the answer
        cp.cuda.Device().synchronize()
        windows.append((time.perf_counter() - t0) * 1e3)
    hs = ours.recv()
    proc.join()
    j = js.get().astype(np.int64)
    h = np.array(hs, dtype=np.int64)
    rows = []
    for i in range(warmup, n):
        r = {"window": windows[i], "host": host[i], "msg": cpu[i][0], "hostbusy": cpu[i][1], "reply": cpu[i][2]}
        if ns:  # the judge's own stamps never touch the host's streams
            j0, j1, j2 = j[3 * i], j[3 * i + 1], j[3 * i + 2]
            r.update(spin=(j1 - j0) / 1e6, gap=(j2 - j1) / 1e6 - host[i])
        if stamps_on and ns:
            h0, h1 = h[2 * i], h[2 * i + 1]
            r.update(handoff=(h0 - j1) / 1e6, work=(h1 - h0) / 1e6, tail=(j2 - h1) / 1e6)
        rows.append(r)
    return {k: [r[k] for r in rows] for k in rows[0]}


def inproc_run(cand: str, preroll_ms: float, calls: int, warmup: int, flush_mb: int) -> dict:
    """One process: the spin on the caller's own stream (a model's stream), then the call."""
    import cupy as cp

    spin = cp.RawModule(code=SRC).get_function("spin")
    js = cp.zeros(2, dtype=cp.uint64)
    flush = cp.empty(flush_mb << 18, dtype=cp.uint32)
    fn = make_fn(cand)
    ns = int(preroll_ms * 1e6)
    windows, host = [], []
    for i in range(warmup + calls):
        flush.fill(i + 1)
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        if ns:
            spin((1,), (1,), (np.uint64(ns), js, np.int32(0)))
        a = cp.cuda.Event()
        a.record()
        fn()
        b = cp.cuda.Event()
        b.record()
        cp.cuda.Device().synchronize()
        windows.append((time.perf_counter() - t0) * 1e3)
        host.append(cp.cuda.get_elapsed_time(a, b))
    return {"window": windows[warmup:], "host": host[warmup:]}


def label(cand: str) -> str:
    try:
        import json

        return f"segments={json.loads((Path(cand) / 'params.json').read_text())['params']['segments']}"
    except (OSError, KeyError, ValueError):
        return cand[-10:]


def med(xs):
    return statistics.median(xs)


def show(label: str, r: dict, null_window: float | None) -> None:
    line = f"{label:<46} window {med(r['window']):7.3f}  host {med(r['host']):6.3f}"
    if null_window is not None:
        extra = med(r["window"]) - null_window - med(r["host"])
        line += f"  window-null {med(r['window']) - null_window:6.3f}  unexplained {extra:6.3f}"
    for k in ("msg", "hostbusy", "reply", "spin", "gap", "handoff", "work", "tail"):
        if k in r:
            xs = sorted(r[k])
            line += f"  {k} {med(xs):6.3f} [{xs[len(xs) // 10]:.3f},{xs[-1 - len(xs) // 10]:.3f}]"
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cands", nargs="*", help="rendered candidate folders (solution.py inside)")
    ap.add_argument("--variants", nargs="+", default=["none"],
                    choices=["none", "prio0", "blocking", "allwait", "ownstream", "cpuwait"])
    ap.add_argument("--preroll", nargs="+", type=float, default=[2.5])
    ap.add_argument("--stamps", choices=["on", "off", "both"], default="both")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--flush-mb", type=int, default=256)
    ap.add_argument("--inproc", action="store_true", help="also time each candidate in this process")
    a = ap.parse_args()
    stamp_modes = {"on": [True], "off": [False], "both": [False, True]}[a.stamps]
    for pre in a.preroll:
        for stamps_on in stamp_modes:
            tag = f"pre {pre:g} ms, stamps {'on' if stamps_on else 'off'}"
            null = judge_run("noop", "none", pre, a.calls, a.warmup, stamps_on, a.flush_mb)
            nw = med(null["window"])
            show(f"noop            | {tag}", null, None)
            for cand in a.cands:
                for v in a.variants:
                    r = judge_run(cand, v, pre, a.calls, a.warmup, stamps_on, a.flush_mb)
                    show(f"{label(cand):<10} {v:<9}| {tag}", r, nw)
        if a.inproc:
            null = inproc_run("noop", pre, a.calls, a.warmup, a.flush_mb)
            nw = med(null["window"])
            show(f"noop in-process | pre {pre:g} ms", null, None)
            for cand in a.cands:
                show(f"{label(cand):<10} in-process | pre {pre:g} ms", inproc_run(cand, pre, a.calls, a.warmup, a.flush_mb), nw)


if __name__ == "__main__":
    main()

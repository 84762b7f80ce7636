"""The GPU kept busy before each call (`timing.preroll_ms`), judge side and host side.

In a model's stream a kernel is launched while the GPU is still busy with earlier work, so
the time its launch path takes on the CPU is hidden. A call timed on an idle GPU counts
that path inside its CUDA events: on the H200, fla (a dozen Triton kernels launched from
Python, about 1 ms of CPU) measured 2.88-3.08 ms so against 2.63 ms with its launches
queued behind 0.5 ms of GPU work in its own stream. So before each call the judge runs a
kernel of its own that spins for `preroll_ms` and records an interprocess event after it;
the host's stream waits on that event before its start event, and its launches queue up
meanwhile. The spin must outlast the round trip of the call message plus the call's launch
path: 0.5 ms did not (the spin was over before the host launched), hence 2.5 ms at the
scored shape.

The spin is the judge's own work, in every window alike (the no-op's included): a host
that does not wait gains nothing (its kernels cannot run beside another process's, and
its events then count the spin), so there is nothing here a candidate could skip to make
room in the judge's clock.

Every stream a candidate makes through CuPy waits on the event too, not only the call's. A candidate
that forks side streams orders them behind the call's stream by an event of its own, which is
enough for correctness; but on the H200 such a chain, pending in the host's context while the
judge's spin runs in another, cost the call one whole scheduling time slice: the spin itself
took 4.5 ms instead of 2.5, and every `segments > 1` point benched at 3.0-3.4 ms against
0.86 ms by its events. Waiting on the judge's event directly on each stream removed it
(benchmarks/judge_handoff_probe.py, docs/benchmarks.md). The streams are found by wrapping
CuPy's stream class before any candidate code runs. A stream made past it (torch's, raw CUDA
calls) is not seen and keeps the old cost, never a gain: the judge's window counts everything
until the host answers. (Wrapping torch's class as well crashed fla's host on the H100.)"""
from __future__ import annotations

import weakref
from typing import Any

from .backend import Backend

_SPIN = r"""
extern "C" __global__ void kda_judge_preroll(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


class Preroll:
    """Judge side: the spin kernel and the event the hosts wait on (nothing on the CPU)."""

    def __init__(self, be: Backend, ms: float) -> None:
        self.be, self.ns = be, int(ms * 1e6)
        self.kernel: Any = None
        self.event: Any = None
        if be.device != "cuda" or self.ns <= 0:
            return
        cp = be.xp
        self.kernel = cp.RawKernel(_SPIN, "kda_judge_preroll")
        self.event = cp.cuda.Event(block=False, disable_timing=True, interprocess=True)
        self.kernel((1,), (1,), (cp.uint64(0),))  # compiled (or read from the cache) now, not in a window
        be.sync()

    @property
    def handle(self) -> str | None:
        """What a host opens the event by (hex), or None when there is no pre-roll."""
        if self.event is None:
            return None
        return bytes(self.be.xp.cuda.runtime.ipcGetEventHandle(self.event.ptr)).hex()

    def start(self) -> None:
        """Enqueue the spin and record the event after it; not waited for here."""
        if self.kernel is None:
            return
        cp = self.be.xp
        self.kernel((1,), (1,), (cp.uint64(self.ns),))
        self.event.record()


class Streams:
    """Host side: the streams this process makes through CuPy, weakly held, to wait on.
    `watch` replaces `cupy.cuda.Stream` by a subclass that records each instance; it runs
    before any candidate code."""

    def __init__(self) -> None:
        self._made: weakref.WeakSet = weakref.WeakSet()
        self._watched = False

    def handles(self) -> list[int]:
        return [h for h in (getattr(s, "ptr", 0) for s in list(self._made)) if h]

    def watch(self, cp: Any) -> None:
        if self._watched:
            return
        base, made = cp.cuda.Stream, self._made

        class Meta(type(base)):  # type: ignore[misc]
            # CuPy's own streams (get_current_stream's, Stream.null) are of the class it
            # had: they stay instances of the name a candidate checks against
            def __instancecheck__(cls, obj: Any) -> bool:
                return isinstance(obj, base)

            def __subclasscheck__(cls, sub: Any) -> bool:
                return issubclass(sub, base)

        class Watched(base, metaclass=Meta):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                made.add(self)

        Watched.__name__ = Watched.__qualname__ = base.__name__
        Watched.__module__ = base.__module__
        cp.cuda.Stream = cp.cuda.stream.Stream = Watched  # the same class under both names
        self._watched = True


class Waiter:
    """Host side: before a call, the current stream and every stream of `streams` wait on the
    judge's event."""

    def __init__(self, be: Backend, handle: str | None, streams: Streams | None = None) -> None:
        self.be, self.event, self.streams = be, None, streams or Streams()
        if be.device == "cuda" and handle:
            self.event = be.xp.cuda.runtime.ipcOpenEventHandle(bytes.fromhex(handle))

    def wait(self) -> None:
        if self.event is not None:
            cp = self.be.xp
            current = cp.cuda.get_current_stream().ptr
            cp.cuda.runtime.streamWaitEvent(current, self.event, 0)
            for ptr in self.streams.handles():
                if ptr != current:
                    cp.cuda.runtime.streamWaitEvent(ptr, self.event, 0)

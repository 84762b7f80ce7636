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
room in the judge's clock."""
from __future__ import annotations

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


class Waiter:
    """Host side: the current stream waits on the judge's event before a call."""

    def __init__(self, be: Backend, handle: str | None) -> None:
        self.be, self.event = be, None
        if be.device == "cuda" and handle:
            self.event = be.xp.cuda.runtime.ipcOpenEventHandle(bytes.fromhex(handle))

    def wait(self) -> None:
        if self.event is not None:
            cp = self.be.xp
            cp.cuda.runtime.streamWaitEvent(cp.cuda.get_current_stream().ptr, self.event, 0)

"""The pre-roll wait covers every stream the host's process makes (judge/preroll.py).

On the H200 a candidate whose side streams waited on the judge's event only through an event
of its own lost a scheduling time slice a call (about 2 ms: every `segments > 1` point benched
at 3.0-3.4 ms against 0.86 ms by its events). These run without a GPU, so CuPy's stream
class and the CUDA runtime are stand-ins (FakeCuda: named as such), recording the
waits the host asks for; `test_attacks_gpu.py` benches such a candidate on a GPU."""
from __future__ import annotations

import gc
import types

from kcoral.workloads.kda.judge.backend import Backend
from kcoral.workloads.kda.judge.preroll import Streams, Waiter


class FakeStream:
    """A stand-in for cupy.cuda.Stream: a handle, and `with` makes it current."""
    count = 0

    def __init__(self, null: bool = False, non_blocking: bool = False, priority: int | None = None) -> None:
        FakeStream.count += 1
        self.ptr = 0 if null else 0x1000 + FakeStream.count
        self.non_blocking, self.priority = non_blocking, priority


class FakeCuda(types.SimpleNamespace):
    """A stand-in for cupy (the parts preroll.py touches): streamWaitEvent is recorded."""

    def __init__(self) -> None:
        self.waits: list[tuple[int, str]] = []
        current = FakeStream()
        runtime = types.SimpleNamespace(ipcOpenEventHandle=lambda raw: f"event:{raw.hex()}",
                                        streamWaitEvent=lambda ptr, ev, flags: self.waits.append((ptr, ev)))
        cuda = types.SimpleNamespace(Stream=FakeStream, stream=types.SimpleNamespace(Stream=FakeStream),
                                     runtime=runtime, get_current_stream=lambda: current)
        super().__init__(cuda=cuda, current=current)


def _host(streams: Streams) -> tuple[FakeCuda, Waiter]:
    cp = FakeCuda()
    streams.watch(cp)
    be = Backend(xp=cp, device="cuda", name="FakeCuda")
    return cp, Waiter(be, "ab12", streams)


def test_every_stream_the_candidate_makes_waits_on_the_judge():
    streams = Streams()
    cp, waiter = _host(streams)
    # what the two_pass template does in setup, through the names a candidate uses
    prep, walk = cp.cuda.Stream(non_blocking=True, priority=0), cp.cuda.stream.Stream(non_blocking=True, priority=-1000)
    waiter.wait()
    waited = {ptr for ptr, ev in cp.waits if ev == "event:ab12"}
    assert waited == {cp.current.ptr, prep.ptr, walk.ptr}
    assert isinstance(prep, FakeStream) and type(prep).__name__ == "FakeStream"  # still the class it asked for
    assert isinstance(cp.current, cp.cuda.Stream) and issubclass(FakeStream, cp.cuda.Stream)  # and CuPy's own stay its
    assert prep.priority == 0 and walk.priority == -1000  # arguments reach the real constructor


def test_a_dropped_stream_is_no_longer_waited_on_and_the_current_once():
    streams = Streams()
    cp, waiter = _host(streams)
    side = cp.cuda.Stream(non_blocking=True)
    gone = cp.cuda.Stream(non_blocking=True)
    gone_ptr = gone.ptr
    del gone
    gc.collect()
    cp.current = side  # a candidate may call from within one of its own streams
    cp.cuda.get_current_stream = lambda: side
    waiter.wait()
    ptrs = [ptr for ptr, _ in cp.waits]
    assert gone_ptr not in ptrs and ptrs.count(side.ptr) == 1


def test_watching_twice_wraps_once():
    streams = Streams()
    cp, _ = _host(streams)
    first = cp.cuda.Stream
    streams.watch(cp)
    assert cp.cuda.Stream is first and first.__mro__[1] is FakeStream


def test_no_event_no_waits():
    streams = Streams()
    cp = FakeCuda()
    streams.watch(cp)
    cp.cuda.Stream()
    Waiter(Backend(xp=cp, device="cuda", name="FakeCuda"), None, streams).wait()
    assert cp.waits == []

"""The host: the process a candidate (or the baseline) runs in, driven call by call by
the judge: `python -m judge.host FD ROLE DEVICE PREROLL [WRITABLE...]` (a candidate's host
may write beneath the WRITABLE folders only, where the kernel can enforce it; PREROLL is
the judge's pre-roll event, "-" for none, opened before the host confines itself).

Everything here runs in an untrusted process once a candidate is loaded: the candidate can
patch any of it. So the host does as little as it can: it makes the memory a session works
on (its own, which the judge maps and writes), calls `setup` and `fn` there and reports its
own call time, which the judge weighs against its own clock. Every other per-call step
(fresh inputs, poisoned outputs, the cache flush, the snapshot of the outputs) is the
judge's, on that memory: a step left here could be skipped, and the time it saved would be
credited to the call. Roles: `candidate` (a candidate directory) and `trusted` (the baseline
and the no-op calibration candidate; no candidate code is ever loaded there).

Messages (see channel.py), each answered by {"ok": true, ...} or {"ok": false, "kind",
"message"}:
  load   {"dir"} | {"spec"}                      import the candidate | make the baseline
  alloc  {"session", "nbytes"}                   make the session's memory; reply {"ipc"}
                                                 (GPU) or one memfd passed alongside (CPU)
  setup  {"session", "which", "B", "T", "H", "scale", "inputs", "output", "final_state",
          "preroll"}
         setup(data, B, T, H) on views of that memory, which the judge has filled; "preroll":
         the judge's interprocess event each call's stream waits on (GPU; see preroll.py)
  call   {"session", "clock"}                    time fn() alone on the inputs the judge has
         just written (clock "cpu": this process's CPU time); reply {"ms": x} once its work
         is finished
  exit
"""
from __future__ import annotations

import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .backend import Backend, make_backend
# Imported with the host, before any candidate code: nothing of the judge is read from the
# host's folder once candidates may run beside it (fla and torch load at the baseline's make).
from .baseline import make_baseline
from .channel import Channel, ChannelClosed
from .confine import PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, confine_writes, prctl
from .harness import CandidateError, load_solution, tail
from .memory import Buffer, export, place
from .preroll import Streams, Waiter
from .spec import parse_spec

FILE_LIMIT = 1 << 30  # bytes any file it writes may reach (its log included)


def _harden() -> None:
    """Before any candidate code: no privilege gain through exec, and a bound on what the
    process may write to files (its log included)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    except (ValueError, OSError):
        pass


class _NoOp:
    """The calibration candidate: does nothing, so a batch of it costs only the protocol (the
    judge's writes, flush and snapshots, the round trip, the timers): the judge's measure of
    overhead."""

    @staticmethod
    def setup(data: dict, B: int, T: int, H: int) -> Callable[[], None]:
        return lambda: None


class Session:
    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer  # memory.Buffer: this process's own, mapped by the judge
        self.fn: Any = None  # the candidate's setup() result, set by op_setup
        self.waiter: Waiter | None = None


class Host:
    def __init__(self, chan: Channel, role: str, be: Backend, waiters: dict[str, Waiter] | None = None,
                 confined: bool = False, streams: Streams | None = None) -> None:
        self.chan, self.role, self.be = chan, role, be
        self.streams = streams or Streams()  # what each call's pre-roll wait covers (preroll.py)
        self.module: Any = None  # the candidate's solution module (role candidate)
        self.baseline: Any = None  # baseline.make_baseline's (role baseline)
        self.sessions: dict[int, Session] = {}
        self.waiters: dict[str, Waiter] = dict(waiters or {})  # by event handle: each opened once
        self.confined = confined  # no event can be opened any more (confine.py)

    def serve(self) -> None:
        while True:
            try:
                msg, fds = self.chan.recv()
            except ChannelClosed:
                return
            op = msg.get("op")
            if op == "exit":
                return
            out_fds: list[int] = []
            try:
                reply = getattr(self, f"op_{op}")(msg, fds)
                out_fds = reply.pop("_fds", [])
                reply["ok"] = True
            except CandidateError as exc:
                reply = {"ok": False, "kind": exc.kind, "message": exc.message}
            except Exception as exc:  # noqa: BLE001 - a broken request or a host fault
                reply = {"ok": False, "kind": "runtime", "message": f"host error: {type(exc).__name__}: {exc}\n{tail()}"}
            if not reply["ok"] and self.role != "candidate" and reply["kind"] != "unavailable":
                # The trusted host runs the baseline and the no-op: what fails there is this
                # server's setup (a compiler the baseline's JIT cannot run, a broken package),
                # never the candidate's doing; as "runtime" it would teach a search that a good
                # point is infeasible.
                reply = {"ok": False, "kind": "unavailable",
                         "message": f"the baseline failed on this server, not the candidate: {reply['message']}"}
            self.chan.send(reply, out_fds)

    def op_load(self, msg: dict, fds: list) -> dict:
        if self.role == "candidate":
            self.module = load_solution(Path(msg["dir"]), "kda_candidate")
            return {}
        spec = parse_spec(msg["spec"])
        self.baseline, note = make_baseline(self.be, spec)
        return {"name": self.baseline.name, "note": note}

    def _module(self, which: str) -> Any:
        if self.role == "candidate":
            return self.module
        return {"baseline": self.baseline, "null": _NoOp}[which]

    def op_alloc(self, msg: dict, fds: list) -> dict:
        sid = int(msg["session"])
        buf, info, out_fds = export(self.be, sid, int(msg["nbytes"]))
        self.sessions[sid] = Session(buf)
        return dict(info, _fds=out_fds)

    def op_setup(self, msg: dict, fds: list) -> dict:
        s = self.sessions[int(msg["session"])]
        inputs = {n: place(s.buffer.base, d) for n, d in msg["inputs"].items()}
        output, final_state = place(s.buffer.base, msg["output"]), place(s.buffer.base, msg["final_state"])
        data = dict(inputs, output=output, final_state=final_state, scale=float(msg["scale"]))
        B, T, H = int(msg["B"]), int(msg["T"]), int(msg["H"])
        which = msg.get("which", "baseline")
        try:
            if which == "baseline_check":  # the baseline writes into our outputs, not only its own tensors
                fn = self.baseline.setup(data, B, T, H, write_outputs=True)
            else:
                fn = self._module(which).setup(data, B, T, H)
            self.be.sync()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise CandidateError("import", f"setup(data, B={B}, T={T}, H={H}) raised:\n{tail()}") from None
        if not callable(fn):
            raise CandidateError("import", f"setup returned {type(fn).__name__}, not a callable")
        handle = msg.get("preroll") or ""
        if handle not in self.waiters:
            if self.confined and handle:
                raise RuntimeError("the judge's pre-roll event was not handed to this host before it confined itself")
            self.waiters[handle] = Waiter(self.be, handle, self.streams)
        s.fn, s.waiter = fn, self.waiters[handle]
        return {}

    def op_call(self, msg: dict, fds: list) -> dict:
        """One call, timed alone, all of its work finished before answering: the judge has
        written its inputs, poisoned its outputs and flushed the cache; it snapshots the
        outputs once we answer."""
        s = self.sessions[int(msg["session"])]
        timer = _Timer(self.be, cpu=msg.get("clock") == "cpu")
        try:
            if s.waiter is not None:
                s.waiter.wait()  # the judge's pre-roll: our launches queue behind it
            timer.start()
            s.fn()
            timer.stop()
            ms = timer.finish()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise CandidateError("runtime", f"fn() raised:\n{tail()}") from None
        return {"ms": ms[0]}


class _Timer:
    """Per-call times: CUDA events enqueued back to back on the current stream (one sync at
    the end), or on the CPU this process's CPU time around each call (every thread; the
    judge's cpuclock weighs it) or, when asked, perf_counter."""

    def __init__(self, be: Backend, cpu: bool = False) -> None:
        self.be = be
        self.pairs: list = []
        self.cuda = be.device == "cuda"
        self.cpu = cpu and not self.cuda
        if self.cuda:
            self.stream = be.xp.cuda.get_current_stream()

    def start(self) -> None:
        if self.cuda:
            ev = self.be.xp.cuda.Event()
            ev.record(self.stream)
            self.pairs.append([ev, None])
        else:
            self.pairs.append([self._now(), None])

    def stop(self) -> None:
        if self.cuda:
            ev = self.be.xp.cuda.Event()
            ev.record(self.stream)
            self.pairs[-1][1] = ev
        else:
            self.pairs[-1][1] = self._now()

    def _now(self) -> float:
        return time.process_time() if self.cpu else time.perf_counter()

    def finish(self) -> list[float]:
        if self.cuda:
            self.be.sync()
            return [self.be.xp.cuda.get_elapsed_time(a, b) for a, b in self.pairs]
        return [(b - a) * 1e3 for a, b in self.pairs]


def _settle() -> None:
    """Before any candidate code: the working folder, first on sys.path, leaves it, so that
    no module imported later can be shadowed by a file planted there."""
    here = os.path.realpath(os.getcwd())
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]


def _confine(be: Backend, writable: list[str]) -> None:
    """A candidate's host gives up writing anywhere but its own folders (confine.py), once
    its GPU context exists: the driver's start-up writes outside them."""
    if be.device == "cuda":
        be.xp.empty(1)
        be.sync()
    if not confine_writes(writable):  # the judge saw Landlock and reports the confinement
        raise OSError("Landlock is not available to this process")


def main(argv: list[str]) -> int:
    # writable: the folders a confined host keeps; preroll: the judge's event, "-" for none
    fd, role, device, preroll, writable = int(argv[0]), argv[1], argv[2], argv[3], argv[4:]
    if role == "trusted":
        # The baseline's host lives through every timing trial, beside each candidate's host
        # of the same uid: not dumpable, no such process may ptrace it or write its memory
        # through /proc (where Landlock does not confine the candidate and Yama allows it).
        prctl(PR_SET_DUMPABLE, 0)
    _harden()
    _settle()
    chan = Channel(socket.socket(fileno=fd))
    try:
        be = make_backend(device)
    except Exception as exc:  # noqa: BLE001
        chan.send({"ok": False, "kind": "unavailable", "message": str(exc)})
        return 1
    confined = role == "candidate" and bool(writable)
    waiters: dict[str, Waiter] = {}
    streams = Streams()
    if be.device == "cuda" and role == "candidate":
        streams.watch(be.xp)  # before any candidate code: its streams are made through it
    try:
        if preroll != "-":  # opened now: once confined, the event's file in /dev/shm cannot be
            waiters[preroll] = Waiter(be, preroll, streams)
        if confined:
            _confine(be, writable)
    except Exception as exc:  # noqa: BLE001 - the judge promised confinement: no run without it
        chan.send({"ok": False, "kind": "unavailable", "message": f"the host could not confine itself: {exc}"})
        return 1
    chan.send({"ok": True, "ready": True})  # the judge trusts an "unavailable" only before this
    # Prints of the candidate go to this process's stdout/stderr: the judge's log file.
    Host(chan, role, be, waiters, confined, streams).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

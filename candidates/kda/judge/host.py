"""The host: the process a candidate (or the baseline) runs in, driven call by call by
the judge: `python -m judge.host FD ROLE DEVICE`.

Everything here runs in an untrusted process once a candidate is loaded: the candidate can
patch any of it. So the host only does work whose result the judge checks for itself:
it copies the inputs the judge lends into its own memory, calls `setup` and `fn` there,
copies each call's outputs into the judge's lent output block and reports its own call
time, which the judge weighs against its own clock. Roles: `candidate` (a candidate directory) and `trusted` (the baseline and the
no-op calibration candidate; no candidate code is ever loaded there).

Messages (see channel.py), each answered by {"ok": true, ...} or {"ok": false, "kind",
"message"}:
  load   {"dir"} | {"spec"}                      import the candidate | make the baseline
  setup  {"session", "which", "B", "T", "H", "scale", "buffers", "inputs", "output",
          "final_state", "input_block", "output_block", "flush_bytes"}
         setup(data, B, T, H) on lent buffers; the flush buffer made and written
  call   {"session", "flush_bytes", "flush_tag", "last", "clock"}   one call on the inputs
         the judge has just written into the session's lent block: copy them in, poison both
         outputs, flush the cache, time fn() (clock "cpu": this process's CPU time), copy both
         outputs out; reply {"ms": x}
  exit
"""
from __future__ import annotations

import ctypes
import functools
import resource
import socket
import sys
import time
from pathlib import Path

from .backend import BF16_NAN_BITS, Backend, bits_view, make_backend
from .channel import Channel, ChannelClosed
from .harness import CandidateError, load_solution, tail
from .memory import Mapper, place

PR_SET_NO_NEW_PRIVS = 38
FILE_LIMIT = 1 << 30  # bytes any file it writes may reach (its log included)


def _harden() -> None:
    """Before any candidate code: no privilege gain through exec, and a bound on what the
    process may write to files (its log included)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    except Exception:  # noqa: BLE001 - not Linux
        pass
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    except (ValueError, OSError):
        pass


class _NoOp:
    """The calibration candidate: does nothing, so a batch of it costs only the host's own
    work (refills, poisoning, flushes, copies, timers): the judge's measure of overhead."""

    @staticmethod
    def setup(data, B, T, H):
        return lambda: None


class Session:
    def __init__(self, fn, output, final_state, input_block, output_block, lent_inputs, lent_outputs) -> None:
        self.fn, self.output, self.final_state = fn, output, final_state
        self.input_block, self.output_block = input_block, output_block  # uint8, this process's memory
        self.lent_inputs, self.lent_outputs = lent_inputs, lent_outputs  # uint8 views of the judge's blocks


class _Relocated:
    """Views placed by the judge's descriptors, in this process's copies of its blocks
    (keyed by each block's offset in the lent buffer)."""

    def __init__(self, blocks: dict[int, object]) -> None:
        self.blocks = sorted(blocks.items())

    def view(self, desc: dict):
        start, block = [b for b in self.blocks if b[0] <= int(desc["offset"])][-1]
        return place(block, desc, start)


class Host:
    def __init__(self, chan: Channel, role: str, be: Backend) -> None:
        self.chan, self.role, self.be = chan, role, be
        self.mapper = Mapper(be)
        self.module = None
        self.baseline = None
        self.sessions: dict[int, Session] = {}
        self.flush = None

    def serve(self) -> None:
        while True:
            try:
                msg, fds = self.chan.recv()
            except ChannelClosed:
                return
            op = msg.get("op")
            if op == "exit":
                return
            try:
                reply = getattr(self, f"op_{op}")(msg, fds)
                reply["ok"] = True
            except CandidateError as exc:
                reply = {"ok": False, "kind": exc.kind, "message": exc.message}
            except Exception as exc:  # noqa: BLE001 - a broken request or a host fault
                reply = {"ok": False, "kind": "runtime", "message": f"host error: {type(exc).__name__}: {exc}\n{tail()}"}
            self.chan.send(reply)

    def op_load(self, msg: dict, fds: list) -> dict:
        if self.role == "candidate":
            self.module = load_solution(Path(msg["dir"]), "kda_candidate")
            return {}
        from .baseline import make_baseline
        from .spec import parse_spec

        spec = parse_spec(msg["spec"])
        self.baseline, note = make_baseline(self.be, spec)
        return {"name": self.baseline.name, "note": note}

    def _module(self, which: str):
        if self.role == "candidate":
            return self.module
        return {"baseline": self.baseline, "null": _NoOp}[which]

    def op_setup(self, msg: dict, fds: list) -> dict:
        self.mapper.add(msg["buffers"], fds)
        # The flush buffer is made and written once here, outside any timed batch: a fresh
        # host's first batch otherwise paid for making 8 MiB resident (its page faults) inside
        # the judge's clock, which the no-op batch in the long-lived trusted host never pays.
        flush = self._flush(int(msg.get("flush_bytes", 0)))
        if flush is not None:
            flush.fill(0)
        view = self.mapper.view
        lent_in, lent_out = view(msg["input_block"]), view(msg["output_block"])
        # The candidate works on memory of this process, never on the lent buffers: on the
        # H200 a kernel reading CUDA-IPC memory ran up to 10x slower (two_pass's prep kernel
        # 13.1 ms against 0.73 ms on the same data held locally), which would time the
        # transport, not the candidate. Lent memory only carries inputs in and outputs out.
        xp = self.be.xp
        work_in, work_out = xp.empty_like(lent_in), xp.empty_like(lent_out)
        # With the copier calls use: its kernel is built (or read from the disk cache) here,
        # not inside the first call's window.
        self.copy(lent_in, work_in)
        self.copy(lent_out, work_out)  # poisoned by the judge
        local = _Relocated({msg["input_block"]["offset"]: work_in, msg["output_block"]["offset"]: work_out})
        inputs = {n: local.view(d) for n, d in msg["inputs"].items()}
        output, final_state = local.view(msg["output"]), local.view(msg["final_state"])
        data = dict(inputs, output=output, final_state=final_state, scale=float(msg["scale"]))
        B, T, H = int(msg["B"]), int(msg["T"]), int(msg["H"])
        which = msg.get("which", "baseline")
        try:
            if which == "baseline_check":  # the baseline writes into our outputs, not only its own tensors
                fn = self.baseline.setup(data, B, T, H, write_outputs=True)
            else:
                fn = self._module(which).setup(data, B, T, H)
            self.be.sync()
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise CandidateError("import", f"setup(data, B={B}, T={T}, H={H}) raised:\n{tail()}") from None
        if not callable(fn):
            raise CandidateError("import", f"setup returned {type(fn).__name__}, not a callable")
        self.sessions[int(msg["session"])] = Session(fn, output, final_state, work_in, work_out, lent_in, lent_out)
        return {}

    def op_call(self, msg: dict, fds: list) -> dict:
        """One call on the inputs the judge has just written into the session's lent block:
        copied into this process's memory, outputs poisoned, cache flushed, the call timed
        alone, its outputs copied into the lent output block, all finished before answering."""
        s = self.sessions[int(msg["session"])]
        flush = self._flush(int(msg.get("flush_bytes", 0)))
        timer = _Timer(self.be, cpu=msg.get("clock") == "cpu")
        copy = self.copy
        try:
            copy(s.lent_inputs, s.input_block)
            bits_view(self.be.xp, s.output).fill(BF16_NAN_BITS)
            s.final_state.fill(float("nan"))
            if flush is not None:
                flush.fill(int(msg.get("flush_tag", 0)))
            timer.start()
            s.fn()
            timer.stop()
            copy(s.output_block, s.lent_outputs)  # both outputs, one copy
            if msg.get("last"):
                copy(s.input_block, s.lent_inputs)  # as the last call left them: the judge checks they are intact
            ms = timer.finish()
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise CandidateError("runtime", f"fn() raised:\n{tail()}") from None
        return {"ms": ms[0]}

    @functools.cached_property
    def copy(self):
        """Block copies between lent buffers and this process's memory. On a GPU they run as
        a kernel over 32-bit words: a memcpy involving IPC memory may take a staged path far
        slower than a kernel's own loads and stores."""
        xp = self.be.xp
        if self.be.device != "cuda":
            def copy(src, dst):
                dst[...] = src
            return copy
        kernel = xp.ElementwiseKernel("uint32 x", "uint32 y", "y = x", "kda_block_copy")

        def copy(src, dst):
            kernel(src.view(xp.uint32), dst.view(xp.uint32))
        return copy

    def _flush(self, nbytes: int):
        if nbytes <= 0:
            return None
        words = max(1, nbytes // 4)  # written as 32-bit words: a byte-wise fill is several times slower
        if self.flush is None or self.flush.size != words:
            self.flush = self.be.xp.empty(words, dtype=self.be.xp.uint32)
        return self.flush


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


def main(argv: list[str]) -> int:
    fd, role, device = int(argv[0]), argv[1], argv[2]
    _harden()
    chan = Channel(socket.socket(fileno=fd))
    try:
        be = make_backend(device)
    except Exception as exc:  # noqa: BLE001
        chan.send({"ok": False, "kind": "unavailable", "message": str(exc)})
        return 1
    # Prints of the candidate go to this process's stdout/stderr: the judge's log file.
    Host(chan, role, be).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Runs one program inside a worker: instructions in order, results streamed to the parent.

Each instruction is announced (`step`) before it runs and each return is sent as soon as it
is encoded, so a crash of the whole worker still leaves the parent with the active
instruction index and every earlier result.
"""
from __future__ import annotations

import os
import socket
import sys
import traceback
import types
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kcoral import builtins as program_helpers
from kcoral.extensions import OptIn
from kcoral.runners.sandboxed import kill_orphans
from kcoral.errors import SerializationError
from kcoral.protocol.dtypes import RELEASED_DTYPES
from kcoral.protocol.error_kind import FAILED_KINDS, ErrorKind
from kcoral.protocol.limits import TRACEBACK_LIMIT
from kcoral.protocol.paths import normalize_path
from kcoral.values import ALL_DTYPES, PartSink, encode_value, numpy_dtype

from . import builtins as builtin_registry
from .builtins import CudaSource
from .channel import FDS_PER_MESSAGE, SyncChannel
from .failures import ParseFailure, ProgramFailure, SerializationFailure, Unavailable
from .workspace import BlobCorrupted, BlobRef, WorkspaceError, read_blob, read_file, read_folder, write_file_from


@dataclass
class _LazyBlob:
    """A host-side upload read from its blob only when a program first uses it."""

    kind: str  # "bytes" | "tensor"
    blob: BlobRef
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclass
class _Function:
    fn: Callable[..., Any]
    cpu_only: bool


def _silence_output() -> None:
    """output_limit_bytes 0: the program's fds 1 and 2 go to /dev/null. (Otherwise they
    already point at the request's capture files, set up by the launcher.)"""
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def _is_cuda_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name in ("CUDARuntimeError", "CUDADriverError", "CUDAError", "CuDNNError", "AcceleratorError") \
        or "cudaError" in str(exc)[:200] or "CUDA error" in str(exc)[:200]


def _error_kind(exc: BaseException) -> ErrorKind:
    """The released protocol's kind: an exception of program code is `engine`; CUDA faults
    are `runtime` (`gpu_access` means a cpu_only function touched the GPU)."""
    if isinstance(exc, ProgramFailure):
        return exc.kind
    if isinstance(exc, program_helpers.ExecutionError):
        kind = ErrorKind.of(exc.kind)
        return kind if isinstance(kind, ErrorKind) and kind in FAILED_KINDS else ErrorKind.RUNTIME
    if isinstance(exc, SerializationError):
        return ErrorKind.SERIALIZATION
    if isinstance(exc, WorkspaceError):
        return ErrorKind.RUNTIME
    if _is_cuda_error(exc):
        return ErrorKind.RUNTIME
    return ErrorKind.ENGINE


def _torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _torch_cuda_tensor(data: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    torch_dtype = getattr(torch, dtype)
    if len(data) == 0:
        return torch.empty(shape, dtype=torch_dtype, device="cuda")
    host = torch.frombuffer(data, dtype=torch.uint8).view(torch_dtype).reshape(shape)
    return host.to("cuda")


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "$ref" in value


def receive_blob_fds(sock: socket.socket, digests: list[str], verify: bool) -> dict[str, BlobRef]:
    """The read-only descriptors of this program's blobs, sent by the server in order."""
    out: dict[str, BlobRef] = {}
    while len(out) < len(digests):
        _msg, fds, flags, _addr = socket.recv_fds(sock, 64, FDS_PER_MESSAGE)
        if flags & socket.MSG_CTRUNC:   # the kernel dropped what this process had no room for
            for fd in fds:
                os.close(fd)
            raise RuntimeError(f"blob descriptors were dropped in passing after {len(out) + len(fds)} of "
                               f"{len(digests)}: the request's open-file limit is too low for its blobs")
        if not fds:
            raise RuntimeError("the server closed the blob channel early")
        for fd in fds:
            digest = digests[len(out)]
            out[digest] = BlobRef(fd, digest if verify else None)
    return out


class Executor:
    def __init__(self, chan: SyncChannel, backend: str, fd_sock: socket.socket | None = None,
                 verify_blobs: bool = False, before_program: Callable[[], Any] | None = None) -> None:
        self.chan = chan
        self.before_program = before_program  # run before a program's first instruction (worker.py)
        self.fd_sock = fd_sock
        self.verify_blobs = verify_blobs
        self.backend = backend  # "cpu" | "virtual" | "gpu"
        self.uses_lease = backend in ("gpu", "virtual")
        self.builtins = builtin_registry.load("gpu" if backend == "gpu" else "cpu", self)
        # `kcoral.builtins.benchmark` (the released helper) times with our builtin.
        program_helpers.install(self.builtins["benchmark"].fn)
        self.holding = False
        self.recycle = False
        self.bad_blobs: list[str] = []  # blobs found rewritten: the server drops them from its cache
        self.opt_ins: frozenset[OptIn] = frozenset()
        self.dtypes: frozenset[str] = RELEASED_DTYPES  # tensor dtypes this request's client decodes

    # ------------------------------------------------------------------ parent calls
    def holdout_seeds(self, namespace: str, count: int) -> list[int]:
        self.chan.send({"t": "seeds", "namespace": namespace, "count": count})
        reply, _ = self.chan.recv()
        if reply.get("t") != "seeds_ok":
            raise Unavailable(str(reply.get("message", "holdout seeds unavailable")))
        return [int(s) for s in reply["seeds"]]

    def _acquire(self) -> None:
        if self.uses_lease and not self.holding:
            self.chan.send({"t": "lease"})
            reply, _ = self.chan.recv()
            if reply.get("t") != "lease_ok":
                raise ProgramFailure(str(reply.get("message", "GPU lease refused")))
            self.holding = True

    def _release(self) -> None:
        if self.holding:
            self.chan.send({"t": "release"})
            self.holding = False

    # ------------------------------------------------------------------ job
    def run_job(self, job: dict[str, Any]) -> None:
        """Run the one program this worker serves. No clean-up of interpreter state: the
        worker exits afterwards (processes it left are killed with its sandbox)."""
        work = job["workspace"]
        self.holding = False
        self.opt_ins = frozenset(OptIn(o) for o in job.get("opt_ins", ()))
        self.dtypes = ALL_DTYPES if OptIn.EXTRA_DTYPES in self.opt_ins else RELEASED_DTYPES
        digests: list[str] = job["blobs"]
        blobs = receive_blob_fds(self.fd_sock, digests, self.verify_blobs) if digests and self.fd_sock else {}
        if job["output_limit"] <= 0:
            _silence_output()
        os.chdir(work)
        sys.path.insert(0, work)
        try:
            status, error = self._run(job, blobs)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - a program may have replaced or closed them
                pass
            self._release()
            # Nothing the program started may keep running (or hold the GPU) once it is
            # done: killed and reaped, however long the reaping takes.
            kill_orphans(reap_s=None)
        self.chan.send({"t": "done", "status": status, "error": error, "recycle": self.recycle,
                        "bad_blobs": self.bad_blobs})

    def _run(self, job: dict[str, Any], blobs: dict[str, BlobRef]) -> tuple[str, dict[str, Any] | None]:
        registers: dict[str, Any] = {}
        sink = PartSink()
        if job["instructions"] and self.before_program is not None:
            self.before_program()
        for index, ins in enumerate(job["instructions"]):
            self.chan.send({"t": "step", "i": index})
            try:
                self._instruction(ins, registers, blobs, job["workspace"], sink)
            except BaseException as exc:  # any failure of program code ends the program
                if isinstance(exc, (KeyboardInterrupt,)):
                    raise
                kind = _error_kind(exc)
                if isinstance(exc, BlobCorrupted) and exc.digest:
                    self.bad_blobs.append(exc.digest)
                if _is_cuda_error(exc):
                    self.recycle = True  # a CUDA error can leave the context unusable
                tb = traceback.format_exc()
                if len(tb) > TRACEBACK_LIMIT:
                    tb = "...\n" + tb[-(TRACEBACK_LIMIT - 4):]
                known = (ProgramFailure, SerializationError, WorkspaceError, program_helpers.ExecutionError)
                message = str(exc) if isinstance(exc, known) else f"{type(exc).__name__}: {exc}"
                return "FAILED", {
                    "kind": kind.value, "message": message[:4096], "instruction_index": index,
                    "instruction_op": ins.get("op"), "instruction_id": ins.get("id"), "traceback": tb,
                }
        return "COMPLETED", None

    def _instruction(self, ins: dict[str, Any], regs: dict[str, Any], blobs: dict[str, BlobRef], work: str, sink: PartSink) -> None:
        op = ins["op"]
        if op == "upload":
            self._upload(ins, regs, blobs, work)
        elif op == "get_function":
            module = regs[ins["module"]["$ref"]]
            if isinstance(module, CudaSource):
                raise Unavailable("a CUDA module has no Python functions; compile it with builtin.compile_cuda")
            if not isinstance(module, types.ModuleType):
                raise Unavailable("get_function needs a Python module upload")
            if not hasattr(module, ins["name"]):
                raise ParseFailure(f"the uploaded Python module defines no name {ins['name']!r}")
            # Any object is accepted (as released servers do); running a non-callable fails.
            regs[ins["id"]] = _Function(getattr(module, ins["name"]), bool(ins.get("cpu_only", False)))
        elif op == "run":
            regs[ins["id"]] = self._call(ins, regs)
        elif op == "return":
            self._return(ins, regs, work, sink)
        else:  # the server validated ops; anything else is an engine bug
            raise RuntimeError(f"unknown op {op!r}")

    def _upload(self, ins: dict[str, Any], regs: dict[str, Any], blobs: dict[str, BlobRef], work: str) -> None:
        kind = ins["kind"]
        if kind == "module":
            if ins.get("language", "python") == "cuda":
                regs[ins["id"]] = CudaSource(ins["source"])
                return
            name = f"kcoral_program_{ins['id']}"
            module = types.ModuleType(name)
            module.__file__ = os.path.join(work, f"<upload {ins['id']}>")
            try:
                code = compile(ins["source"], f"<upload {ins['id']}>", "exec")
            except SyntaxError as exc:
                raise ParseFailure(f"SyntaxError: {exc}") from None
            sys.modules[name] = module  # so dataclasses/pickle inside it can find it
            try:
                exec(code, module.__dict__)
            except Exception as exc:  # a failing module body is `parse`, as released
                raise ParseFailure(f"{type(exc).__name__}: {exc}") from exc
            regs[ins["id"]] = module
        elif kind == "tensor":
            blob = _LazyBlob("tensor", blobs[ins["blob"]], ins["dtype"], tuple(ins["shape"]))
            if self.uses_lease:
                self._acquire()
            regs[ins["id"]] = self._materialise(blob) if self.backend == "gpu" else blob
        elif kind == "bytes":
            regs[ins["id"]] = _LazyBlob("bytes", blobs[ins["blob"]])
        elif kind == "file":
            write_file_from(work, ins["path"], blobs[ins["blob"]])
            if ins.get("id") is not None:
                regs[ins["id"]] = normalize_path(ins["path"])  # a named file upload holds its path
        elif kind == "library":
            raise Unavailable("library uploads are not supported by this server")

    def _materialise(self, blob: _LazyBlob) -> Any:
        if blob.kind == "bytes":
            return read_blob(blob.blob)
        assert blob.dtype is not None and blob.shape is not None
        data = read_blob(blob.blob, writable=True)  # programs may write into their tensors
        if self.backend == "gpu" and OptIn.CUPY_TENSORS not in self.opt_ins and _torch_available():
            return _torch_cuda_tensor(data, blob.dtype, blob.shape)  # as the released server gives them
        array = np.frombuffer(data, dtype=numpy_dtype(blob.dtype)).reshape(blob.shape)
        if self.backend == "gpu":
            import cupy

            return cupy.asarray(array)
        return array

    def _value(self, ref: str, regs: dict[str, Any]) -> Any:
        value = regs[ref]
        if isinstance(value, _LazyBlob):
            value = regs[ref] = self._materialise(value)
        if isinstance(value, _Function):
            return value.fn
        return value

    def _args(self, args: list[Any], regs: dict[str, Any]) -> list[Any]:
        """Top-level refs resolve (released protocol); nested ones only with the opt-in,
        else they stay literal dicts, which released clients rely on."""
        if OptIn.NESTED_REFS in self.opt_ins:
            return self._resolve(args, regs)
        return [self._value(a["$ref"], regs) if _is_ref(a) else a for a in args]

    def _resolve(self, value: Any, regs: dict[str, Any]) -> Any:
        if isinstance(value, dict):
            if "$ref" in value:
                return self._value(value["$ref"], regs)
            return {k: self._resolve(v, regs) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve(v, regs) for v in value]
        return value

    def _call(self, ins: dict[str, Any], regs: dict[str, Any]) -> Any:
        fn_spec = ins["fn"]
        if isinstance(fn_spec, str):
            name = fn_spec.split(".", 1)[1]
            builtin = self.builtins.get(name)
            if builtin is None:
                raise Unavailable(f"no builtin named {name!r} on this server")
            if builtin.needs_gpu:
                self._acquire()
            fn, = (builtin.fn,)
        else:
            target = regs[fn_spec["$ref"]]
            if isinstance(target, _Function) and target.cpu_only:
                self._release()
            else:
                self._acquire()
            fn = self._value(fn_spec["$ref"], regs)
            if not callable(fn):
                raise ProgramFailure(f"handle {fn_spec['$ref']!r} is not callable")
        args = self._args(ins.get("args", []), regs)
        return fn(*args)

    def _return(self, ins: dict[str, Any], regs: dict[str, Any], work: str, sink: PartSink) -> None:
        if "value" in ins:
            value = self._value(ins["value"]["$ref"], regs)
        else:
            path = ins["path"]
            if isinstance(path, dict):
                path = self._value(path["$ref"], regs)
                if not isinstance(path, str):
                    raise SerializationFailure("a return path reference must hold a string")
            try:
                value = read_file(work, path) if ins["kind"] == "file" else read_folder(work, path)
            except (WorkspaceError, OSError) as exc:  # released kind for an unreturnable path
                raise SerializationFailure(f"cannot return {ins['kind']} {path!r}: {exc}") from exc
        start = len(sink.parts)
        try:
            node = encode_value(value, sink, dtypes=self.dtypes)
        except RecursionError:
            raise SerializationError("value nests too deeply") from None
        attachments = [data for _, data in sink.parts[start:]]
        self.chan.send({"t": "return", "key": ins["key"], "node": node}, attachments)
        del sink.parts[start:]  # sent; only the numbering must continue

"""Runs one program inside a worker: instructions in order, results streamed to the parent.

Each instruction is announced (`step`) before it runs and each return is sent as soon as it
is encoded, so a crash of the whole worker still leaves the parent with the active
instruction index and every earlier result.
"""
from __future__ import annotations

import os
import signal
import sys
import traceback
import types
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kcoral.values import PartSink, SerializationError, encode_value, numpy_dtype
from kcoral.wire import TRACEBACK_LIMIT

from . import builtins as builtin_registry
from .builtins import CudaSource
from .channel import SyncChannel
from .failures import GpuAccessFailure, ProgramFailure, Unavailable
from .workspace import WorkspaceError, read_file, read_folder, write_file_from


@dataclass
class _LazyBlob:
    """A host-side upload read from the blob store only when a program first uses it."""

    kind: str  # "bytes" | "tensor"
    path: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclass
class _Function:
    fn: Callable[..., Any]
    cpu_only: bool


class _CaptureOutput:
    """Point fds 1 and 2 at per-request files, so native code and subprocesses are captured."""

    def __init__(self, stdout_path: str, stderr_path: str, enabled: bool) -> None:
        self.paths = (stdout_path, stderr_path)
        self.enabled = enabled
        self.saved: tuple[int, int] | None = None

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        for fd, path in zip((1, 2), self.paths):
            target = path if self.enabled else os.devnull
            new = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
            os.dup2(new, fd)
            os.close(new)

    def __exit__(self, *exc: Any) -> None:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - a program may have replaced or closed them
            pass
        assert self.saved is not None
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__


def _children() -> list[int]:
    """This worker's child processes (orphans included: the worker is a subreaper)."""
    pids: list[int] = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return pids


def _kill_children(rounds: int = 100) -> None:
    """Kill and reap every process a finished program left behind, so none keeps running
    (or holding the GPU) while the worker serves the next program. A killed process's own
    children are re-parented to the worker, hence the rounds."""
    for _ in range(rounds):
        pids = _children()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, ProgramFailure):
        return exc.kind
    if isinstance(exc, SerializationError):
        return "serialization"
    name = type(exc).__name__
    if name in ("CUDARuntimeError", "CUDADriverError", "CUDAError", "CuDNNError") or "cudaError" in str(exc)[:200]:
        return "gpu_access"
    return "runtime"


class Executor:
    def __init__(self, chan: SyncChannel, backend: str) -> None:
        self.chan = chan
        self.backend = backend  # "cpu" | "virtual" | "gpu"
        self.uses_lease = backend in ("gpu", "virtual")
        self.builtins = builtin_registry.load("gpu" if backend == "gpu" else "cpu", self)
        self.holding = False
        self.recycle = False

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
                raise GpuAccessFailure(str(reply.get("message", "GPU lease refused")))
            self.holding = True

    def _release(self) -> None:
        if self.holding:
            self.chan.send({"t": "release"})
            self.holding = False

    # ------------------------------------------------------------------ job
    def run_job(self, job: dict[str, Any]) -> None:
        work = job["workspace"]
        saved_cwd = os.getcwd()
        saved_path = list(sys.path)
        saved_env = dict(os.environ)
        saved_modules = set(sys.modules)
        self.holding = False
        status, error = "COMPLETED", None
        capture = _CaptureOutput(job["stdout_path"], job["stderr_path"], job["output_limit"] > 0)
        try:
            with capture:
                os.chdir(work)
                sys.path.insert(0, work)
                status, error = self._run(job)
        finally:
            os.chdir(saved_cwd)
            sys.path[:] = saved_path
            os.environ.clear()
            os.environ.update(saved_env)
            self._forget_modules(saved_modules, work)
            self._free_device_memory()
            _kill_children()
        self.chan.send({"t": "done", "status": status, "error": error, "recycle": self.recycle})

    def _run(self, job: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        registers: dict[str, Any] = {}
        sink = PartSink()
        blobs: dict[str, str] = job["blobs"]
        for index, ins in enumerate(job["instructions"]):
            self.chan.send({"t": "step", "i": index})
            try:
                self._instruction(ins, registers, blobs, job["workspace"], sink)
            except BaseException as exc:  # noqa: BLE001 - any failure of program code ends the program
                if isinstance(exc, (KeyboardInterrupt,)):
                    raise
                kind = _error_kind(exc)
                if kind == "gpu_access":
                    self.recycle = True  # a CUDA error can leave the context unusable
                tb = traceback.format_exc()
                if len(tb) > TRACEBACK_LIMIT:
                    tb = "...\n" + tb[-(TRACEBACK_LIMIT - 4):]
                message = str(exc) if isinstance(exc, (ProgramFailure, SerializationError, WorkspaceError)) else f"{type(exc).__name__}: {exc}"
                return "FAILED", {
                    "kind": kind, "message": message[:4096], "instruction_index": index,
                    "instruction_op": ins.get("op"), "instruction_id": ins.get("id"), "traceback": tb,
                }
        return "COMPLETED", None

    def _instruction(self, ins: dict[str, Any], regs: dict[str, Any], blobs: dict[str, str], work: str, sink: PartSink) -> None:
        op = ins["op"]
        if op == "upload":
            self._upload(ins, regs, blobs, work)
        elif op == "get_function":
            module = regs[ins["module"]["$ref"]]
            if isinstance(module, CudaSource):
                raise TypeError("a CUDA module has no Python functions; compile it with builtin.compile_cuda")
            if not isinstance(module, types.ModuleType):
                raise TypeError("get_function needs a Python module upload")
            if not hasattr(module, ins["name"]):
                raise AttributeError(f"module has no attribute {ins['name']!r}")
            fn = getattr(module, ins["name"])
            if not callable(fn):
                raise TypeError(f"{ins['name']!r} is not callable")
            regs[ins["id"]] = _Function(fn, bool(ins.get("cpu_only", False)))
        elif op == "run":
            regs[ins["id"]] = self._call(ins, regs)
        elif op == "return":
            self._return(ins, regs, work, sink)
        else:  # the server validated ops; anything else is an engine bug
            raise RuntimeError(f"unknown op {op!r}")

    def _upload(self, ins: dict[str, Any], regs: dict[str, Any], blobs: dict[str, str], work: str) -> None:
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
                from .failures import CompileFailure

                raise CompileFailure(f"SyntaxError: {exc}") from None
            sys.modules[name] = module  # so dataclasses/pickle inside it can find it
            exec(code, module.__dict__)
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
        elif kind == "library":
            raise Unavailable("library uploads are not supported by this server")

    def _materialise(self, blob: _LazyBlob) -> Any:
        if blob.kind == "bytes":
            with open(blob.path, "rb") as f:
                return f.read()
        assert blob.dtype is not None and blob.shape is not None
        array = np.fromfile(blob.path, dtype=numpy_dtype(blob.dtype)).reshape(blob.shape)
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
                raise TypeError(f"{fn_spec['$ref']!r} is not callable")
        args = self._resolve(ins.get("args", []), regs)
        return fn(*args)

    def _return(self, ins: dict[str, Any], regs: dict[str, Any], work: str, sink: PartSink) -> None:
        if "value" in ins:
            value = self._value(ins["value"]["$ref"], regs)
        else:
            path = ins["path"]
            if isinstance(path, dict):
                path = self._value(path["$ref"], regs)
                if not isinstance(path, str):
                    raise TypeError("a return path reference must hold a string")
            if ins["kind"] == "file":
                value = read_file(work, path)
            else:
                value = read_folder(work, path)
        start = len(sink.parts)
        try:
            node = encode_value(value, sink)
        except RecursionError:
            raise SerializationError("value nests too deeply") from None
        attachments = [data for _, data in sink.parts[start:]]
        self.chan.send({"t": "return", "key": ins["key"], "node": node}, attachments)
        del sink.parts[start:]  # sent; only the numbering must continue

    # ------------------------------------------------------------------ hygiene
    def _forget_modules(self, before: set[str], work: str) -> None:
        prefix = os.path.join(work, "")
        for name in set(sys.modules) - before:
            mod = sys.modules.get(name)
            file = getattr(mod, "__file__", None) or ""
            paths = [p for p in (getattr(mod, "__path__", None) or []) if isinstance(p, str)]
            if (name.startswith("kcoral_program_") or file.startswith(prefix)
                    or any(p.startswith(prefix) for p in paths)):
                sys.modules.pop(name, None)
        # Finders cached for the (now deleted) workspace would pile up request after request.
        for key in [k for k in sys.path_importer_cache if isinstance(k, str) and (k == work or k.startswith(prefix))]:
            sys.path_importer_cache.pop(key, None)

    def _free_device_memory(self) -> None:
        if self.backend == "gpu":
            try:
                import cupy

                cupy.get_default_memory_pool().free_all_blocks()
                cupy.get_default_pinned_memory_pool().free_all_blocks()
            except Exception:  # noqa: BLE001 - best effort between programs
                pass

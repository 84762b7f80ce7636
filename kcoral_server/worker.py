"""Worker: serves exactly one program, then exits.

Forked by the zygote (zygote.py) inside the request's sandbox with its limits set and its
privileges dropped. It receives one program over its end of a socketpair (the blobs it
uses arrive as read-only file descriptors on a second socket) and executes it (see
executor.py). A fresh worker serves the next request, so nothing a program changes in
an interpreter (patched modules, threads, handlers) reaches another request.
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import socket
import sys
import threading
from typing import Callable


def _cuda_ok(step: str, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{step} returned CUDA error {code}")


def _init_gpu(done: threading.Event) -> None:
    """Create the CUDA context, so CUDA_VISIBLE_DEVICES (set by the server) is final: a
    program that edits the variable later cannot reach another GPU from this process."""
    try:
        # The costly part, the primary context, through ctypes: a foreign call releases the
        # GIL, so the worker's main thread answers meanwhile (CuPy's calls hold it).
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        _cuda_ok("cuInit", cuda.cuInit(0))
        _cuda_ok("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
        _cuda_ok("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(0).use()  # the runtime adopts the primary context made above
    except Exception as exc:  # noqa: BLE001 - builtins then answer `unavailable`
        print(f"kcoral worker: CUDA init failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        done.set()


def _start_gpu_init() -> Callable[[], object]:
    """Start creating the CUDA context in the background and return the wait for it.

    Creating a context takes about 0.3 s on an H200 host. Made before the worker said it
    was ready, it capped a GPU server at a few programs a second, since every program
    needs a fresh worker; made meanwhile, it is done by the time a program that was
    queued behind another arrives, and a program without instructions never waits. The
    executor waits for it before the first instruction, so no program code runs before
    the context (and with it the visible GPU) is fixed."""
    done = threading.Event()
    threading.Thread(target=_init_gpu, args=(done,), name="cuda-init", daemon=True).start()
    return done.wait


def serve(chan_fd: int, fd_sock_fd: int, worker_id: str, backend: str, verify_blobs: bool) -> None:
    """Announce readiness, run one program, return (the caller exits)."""
    faulthandler.enable()  # a crash prints the Python stack into the request's stderr
    gpu_ready = _start_gpu_init() if backend == "gpu" else None
    from .channel import SyncChannel
    from .executor import Executor

    chan = SyncChannel(socket.socket(fileno=chan_fd))
    fd_sock = socket.socket(fileno=fd_sock_fd)
    executor = Executor(chan, backend, fd_sock, verify_blobs, before_program=gpu_ready)
    chan.send({"t": "ready", "pid": os.getpid()})
    try:
        msg, _ = chan.recv()
    except (EOFError, ConnectionError):
        return
    if msg.get("t") == "exec":
        executor.run_job(msg)

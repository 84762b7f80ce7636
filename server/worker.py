"""Worker process: `python -m server.worker --fd N --worker-id ID --backend cpu|virtual|gpu`.

Long-lived child of the server. It receives one program at a time over its end of a
socketpair and executes it (see executor.py). The server kills its whole process group
on a timeout, so anything a program spawns dies with it.
"""
from __future__ import annotations

import argparse
import ctypes
import faulthandler
import os
import signal
import socket
import sys
import threading


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the closed socket still ends us
        pass


def _become_subreaper() -> None:
    """Orphans of a program's processes (double forks, setsid daemons) are re-parented to
    this worker instead of init, so the executor can kill them after the program."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except Exception:  # noqa: BLE001 - not Linux: only direct children are found
        pass


def _init_gpu() -> None:
    """Create the CUDA context now, so CUDA_VISIBLE_DEVICES (set by the server) is final:
    a program that edits the variable later cannot reach another GPU from this process."""
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(0).use()
    except Exception as exc:  # noqa: BLE001 - builtins then answer `unavailable`
        print(f"kcoral worker: CUDA init failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _warm_imports() -> None:
    try:
        import ml_dtypes  # noqa: F401
    except Exception:  # noqa: BLE001 - the program that needs it will report the error
        pass


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m server.worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--backend", choices=["cpu", "virtual", "gpu"], required=True)
    args = parser.parse_args()
    _die_with_parent()
    _become_subreaper()
    faulthandler.enable()  # a crash prints the Python stack into the request's stderr
    if args.backend == "gpu":
        _init_gpu()
    from .channel import SyncChannel
    from .executor import Executor

    sock = socket.socket(fileno=args.fd)
    chan = SyncChannel(sock)
    executor = Executor(chan, args.backend)
    chan.send({"t": "ready", "pid": os.getpid()})
    # ml_dtypes (bfloat16) is slow to import; warm it up after "ready" so a replacement
    # worker is available at once and a program rarely pays for it.
    threading.Thread(target=_warm_imports, daemon=True).start()
    while True:
        try:
            msg, _ = chan.recv()
        except (EOFError, ConnectionError):
            return
        if msg.get("t") == "exec":
            executor.run_job(msg)
        elif msg.get("t") == "exit":
            return


if __name__ == "__main__":
    main()

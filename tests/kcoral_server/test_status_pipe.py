"""A worker's status pipe is read and closed by the server itself, exactly once, under
either event loop: uvloop's pipe transports closed its number twice, and the second close
took whatever descriptor had been given that number meanwhile."""
from __future__ import annotations

import asyncio
import gc
import os
from types import SimpleNamespace

import pytest

from kcoral_server.pool import WorkerHandle

LOOPS = ["asyncio"]
try:
    import uvloop  # noqa: F401

    LOOPS.append("uvloop")
except ImportError:
    pass


def _new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


@pytest.mark.parametrize("kind", LOOPS)
def test_the_status_pipe_is_closed_once_and_steals_no_descriptor(kind, tmp_path) -> None:
    exits: list = []
    worker = SimpleNamespace(pid=None, _pid_known=asyncio.Event(), _set_exit=lambda v: exits.append(v))
    bystanders: list[int] = []

    async def main() -> None:
        for _ in range(20):
            r, w = os.pipe()
            os.write(w, b"pid 4242\nexit 0\n")
            os.close(w)
            await WorkerHandle._read_status(worker, r)
            # The number is free now: the next descriptor opened takes it.
            bystanders.append(os.open(tmp_path / "bystander", os.O_RDONLY | os.O_CREAT))
            gc.collect()
            await asyncio.sleep(0)  # any close the loop deferred happens here

    loop = _new_loop(kind)
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    gc.collect()
    stolen = []
    for fd in bystanders:
        try:
            os.fstat(fd)
            os.close(fd)
        except OSError:
            stolen.append(fd)
    assert not stolen, f"descriptors closed behind their owner's back: {stolen}"
    assert worker.pid == 4242 and exits[0] == 0

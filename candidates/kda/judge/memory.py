"""Memory the judge owns and lends to a host process: one buffer per lending, views into
it by offset. On the CPU a buffer is a memfd (its descriptor travels over the channel);
on a GPU it is a cudaMalloc allocation shared by a CUDA IPC handle.

A buffer is made fresh for each batch of calls and its handle is sent only with that
batch, so a host cannot open it before it is asked to compute on it. The host can write
anything it maps: the judge verifies from its own private copies, never from these."""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import BF16, Backend

ALIGN = 256
DTYPES = {"bfloat16": BF16, "float32": np.dtype(np.float32), "uint8": np.dtype(np.uint8)}


def dtype_name(dtype) -> str:
    dt = np.dtype(dtype)
    for name, known in DTYPES.items():
        if dt == known:
            return name
    raise ValueError(f"no shared-memory dtype for {dt}")


@dataclass
class Buffer:
    id: int
    nbytes: int
    base: Any  # uint8 array over the whole buffer (judge side)
    fd: int | None = None  # CPU: the memfd
    ipc: str | None = None  # GPU: the IPC handle, hex
    ptr: int | None = None  # GPU: the device pointer (freed by the arena)
    _mm: Any = None
    _used: int = 0

    def info(self) -> dict:
        return {"id": self.id, "nbytes": self.nbytes, "ipc": self.ipc}

    def take(self, shape, dtype) -> tuple[Any, dict]:
        """A fresh view of `shape` and `dtype` in this buffer, and its descriptor."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        offset = self._used
        if offset + n > self.nbytes:
            raise ValueError("buffer overcommitted")
        self._used = offset + -(-n // ALIGN) * ALIGN
        arr = self.base[offset:offset + n].view(dt).reshape(shape)
        return arr, {"buf": self.id, "offset": offset, "shape": list(shape), "dtype": dtype_name(dt)}


def place(block, desc: dict, block_offset: int = 0):
    """The array a descriptor names, as a view of `block`: a uint8 copy (or the whole) of
    the lent buffer whose byte 0 is the buffer's byte `block_offset`."""
    dt = DTYPES[desc["dtype"]]
    shape = tuple(int(x) for x in desc["shape"])
    off = int(desc["offset"]) - block_offset
    n = int(np.prod(shape)) * dt.itemsize
    return block[off:off + n].view(dt).reshape(shape)


def plan_bytes(layout: list[tuple[tuple[int, ...], Any]]) -> int:
    return sum(-(-int(np.prod(s)) * np.dtype(d).itemsize // ALIGN) * ALIGN for s, d in layout) or ALIGN


class Arena:
    """The judge's lendable buffers."""

    def __init__(self, be: Backend) -> None:
        self.be = be
        self._next = 1
        self.live: dict[int, Buffer] = {}

    def buffer(self, nbytes: int) -> Buffer:
        nbytes = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        bid, self._next = self._next, self._next + 1
        if self.be.device == "cuda":
            cp = self.be.xp
            ptr = cp.cuda.runtime.malloc(nbytes)
            mem = cp.cuda.UnownedMemory(ptr, nbytes, self)
            base = cp.ndarray((nbytes,), cp.uint8, cp.cuda.MemoryPointer(mem, 0))
            buf = Buffer(bid, nbytes, base, ipc=bytes(cp.cuda.runtime.ipcGetMemHandle(ptr)).hex(), ptr=ptr)
        else:
            fd = os.memfd_create(f"kda-judge-{bid}", os.MFD_CLOEXEC)
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes)
            buf = Buffer(bid, nbytes, np.frombuffer(mm, dtype=np.uint8), fd=fd, _mm=mm)
        self.live[bid] = buf
        return buf

    def free(self, buf: Buffer) -> None:
        """Only once no live host maps it."""
        self.live.pop(buf.id, None)
        if buf.ptr is not None:
            self.be.sync()
            self.be.xp.cuda.runtime.free(buf.ptr)
            buf.ptr = None
        if buf.fd is not None:
            buf.base = None
            try:
                buf._mm.close()
            except BufferError:  # a view still alive: the mapping goes with the process
                pass
            os.close(buf.fd)
            buf.fd = None

    def free_all(self) -> None:
        for buf in list(self.live.values()):
            self.free(buf)


class Mapper:
    """Host side: buffers mapped by id, views by descriptor."""

    def __init__(self, be: Backend) -> None:
        self.be = be
        self.bases: dict[int, Any] = {}

    def add(self, infos: list[dict], fds: list[int]) -> None:
        fds = list(fds)
        for info in infos:
            bid, nbytes = int(info["id"]), int(info["nbytes"])
            if bid in self.bases:
                continue
            if self.be.device == "cuda":
                cp = self.be.xp
                ptr = cp.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(info["ipc"]))
                mem = cp.cuda.UnownedMemory(ptr, nbytes, self)
                self.bases[bid] = cp.ndarray((nbytes,), cp.uint8, cp.cuda.MemoryPointer(mem, 0))
            else:
                fd = fds.pop(0)
                mm = mmap.mmap(fd, nbytes)
                os.close(fd)
                self.bases[bid] = np.frombuffer(mm, dtype=np.uint8)

    def view(self, desc: dict):
        return place(self.bases[int(desc["buf"])], desc)

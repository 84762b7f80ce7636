"""Memory a host owns and the judge writes into: one buffer per session, made by the host
in its own process and mapped by the judge, views into it by offset. On the CPU a buffer is
a sealed memfd (its descriptor travels over the channel); on a GPU a cudaMalloc allocation
shared by a CUDA IPC handle.

The judge does every per-call step itself on that memory (writing the inputs, poisoning
the outputs, snapshotting them): a step left to the host could be skipped by a candidate
that patches its host, and the time it saved would be credited to the call (the no-op
batch the judge subtracts pays for it). The host owns the memory because a kernel reading
the judge's CUDA IPC memory ran up to 18x slower on the H200 than on the same data in its
own; the judge's copies through such a mapping run at full speed.

The host can write anything it owns: the judge verifies from its own private copies, never
from these. A host that hands over something unusable (a descriptor that can shrink, an
allocation smaller than asked) is refused before anything is written."""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .backend import BF16, Backend

if TYPE_CHECKING:
    from .preroll import Preroll

ALIGN = 256
DTYPES = {"bfloat16": BF16, "float32": np.dtype(np.float32), "uint8": np.dtype(np.uint8)}


def dtype_name(dtype: Any) -> str:
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

    def take(self, shape: tuple[int, ...], dtype: Any) -> tuple[Any, dict]:
        """A fresh view of `shape` and `dtype` in this buffer, and its descriptor."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        offset = self._used
        if offset + n > self.nbytes:
            raise ValueError("buffer overcommitted")
        self._used = offset + -(-n // ALIGN) * ALIGN
        arr = self.base[offset:offset + n].view(dt).reshape(shape)
        return arr, {"buf": self.id, "offset": offset, "shape": list(shape), "dtype": dtype_name(dt)}


def place(base: Any, desc: dict) -> Any:
    """The array a descriptor names, as a view of a buffer's whole uint8 array."""
    dt = DTYPES[desc["dtype"]]
    shape = tuple(int(x) for x in desc["shape"])
    off = int(desc["offset"])
    n = int(np.prod(shape)) * dt.itemsize
    return base[off:off + n].view(dt).reshape(shape)


def plan_bytes(layout: list[tuple[tuple[int, ...], Any]]) -> int:
    return sum(-(-int(np.prod(s)) * np.dtype(d).itemsize // ALIGN) * ALIGN for s, d in layout) or ALIGN


class Arena:
    """The judge's side: buffers adopted from hosts, the judge's own cache-flush buffer and
    its GPU pre-roll (preroll.py)."""

    def __init__(self, be: Backend) -> None:
        self.be = be
        self.live: dict[int, Buffer] = {}
        self._flush: Any = None  # the device array, made at the first flush
        self._preroll: dict[float, Any] = {}

    def preroll(self, ms: float) -> Preroll:
        if ms not in self._preroll:
            from .preroll import Preroll

            self._preroll[ms] = Preroll(self.be, ms)
        return self._preroll[ms]

    def adopt(self, bid: int, nbytes: int, info: dict, fds: list[int]) -> Buffer:
        """Map the buffer a host made for a session; `HostMemoryError` if it is not one of
        `nbytes` that stays so (the judge writes into it while the host lives)."""
        nbytes = _rounded(nbytes)
        if self.be.device == "cuda":
            cp = self.be.xp
            try:
                ptr = cp.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(str(info.get("ipc"))))
            except Exception as exc:  # noqa: BLE001 - a bad handle is the host's failure
                raise HostMemoryError(f"its CUDA IPC handle could not be opened: {exc}") from None
            size = _allocation_size(ptr)
            if size is not None and size < nbytes:
                cp.cuda.runtime.ipcCloseMemHandle(ptr)
                raise HostMemoryError(f"its allocation holds {size} bytes, {nbytes} were asked for")
            mem = cp.cuda.UnownedMemory(ptr, nbytes, self)
            base = cp.ndarray((nbytes,), cp.uint8, cp.cuda.MemoryPointer(mem, 0))
            buf = Buffer(bid, nbytes, base, ipc=info.get("ipc"), ptr=ptr)
        else:
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise HostMemoryError(f"it sent {len(fds)} descriptors for one buffer")
            fd = fds[0]
            try:
                _seal(fd, nbytes)
                mm = mmap.mmap(fd, nbytes)
            except (OSError, ValueError, HostMemoryError) as exc:
                os.close(fd)
                raise HostMemoryError(str(exc)) from None
            buf = Buffer(bid, nbytes, np.frombuffer(mm, dtype=np.uint8), fd=fd, _mm=mm)
        self.live[bid] = buf
        return buf

    def free(self, buf: Buffer) -> None:
        """Only once the host that made it is gone (nothing of the judge uses it after)."""
        self.live.pop(buf.id, None)
        if buf.ptr is not None:
            self.be.sync()
            try:
                self.be.xp.cuda.runtime.ipcCloseMemHandle(buf.ptr)
            except Exception:  # noqa: BLE001 - its process is gone; the mapping goes with the context
                pass
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

    def flush(self, nbytes: int, tag: int = 0) -> None:
        """Write `nbytes` of the judge's own memory (32-bit words; a byte-wise fill is several
        times slower), evicting the cache the candidate's call would otherwise find warm.
        Made and written once outside any window (tag 0), so no window pays its page faults."""
        if nbytes <= 0:
            return
        words = max(1, nbytes // 4)
        if self._flush is None or self._flush.size != words:
            self._flush = self.be.xp.empty(words, dtype=self.be.xp.uint32)
        self._flush.fill(tag)


class HostMemoryError(Exception):
    """A host's buffer the judge cannot safely write into."""


def export(be: Backend, bid: int, nbytes: int) -> tuple[Buffer, dict, list[int]]:
    """The host's side: a buffer of this process's own, the message that lets the judge map
    it, and the descriptors that go with that message (the judge closes its copies)."""
    nbytes = _rounded(nbytes)
    if be.device == "cuda":
        cp = be.xp
        ptr = cp.cuda.runtime.malloc(nbytes)  # an allocation of its own: IPC handles name whole allocations
        mem = cp.cuda.UnownedMemory(ptr, nbytes, None)
        base = cp.ndarray((nbytes,), cp.uint8, cp.cuda.MemoryPointer(mem, 0))
        ipc = bytes(cp.cuda.runtime.ipcGetMemHandle(ptr)).hex()
        return Buffer(bid, nbytes, base, ipc=ipc, ptr=ptr), {"ipc": ipc}, []
    fd = os.memfd_create(f"kda-host-{bid}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    mm = mmap.mmap(fd, nbytes)
    return Buffer(bid, nbytes, np.frombuffer(mm, dtype=np.uint8), fd=fd, _mm=mm), {}, [fd]


def _rounded(nbytes: int) -> int:
    return max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN)


def _seal(fd: int, nbytes: int) -> None:
    """A host's memfd must hold `nbytes` and be sealed against shrinking (writing past the
    end of a shrunk file kills the writer with SIGBUS) and growing."""
    import fcntl

    want = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, want)
    except OSError as exc:
        raise HostMemoryError(f"its descriptor cannot be sealed against resizing ({exc.strerror})") from None
    if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & want != want:
        raise HostMemoryError("its descriptor is not sealed against resizing")
    size = os.fstat(fd).st_size
    if size < nbytes:
        raise HostMemoryError(f"its descriptor holds {size} bytes, {nbytes} were asked for")


def _allocation_size(ptr: int) -> int | None:
    """The size of the CUDA allocation that starts at `ptr` (the driver's view), or None when
    the driver cannot be asked."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    if lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
        return None
    return int(size.value) if int(base.value) == int(ptr) else 0

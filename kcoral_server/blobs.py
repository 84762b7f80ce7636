"""Content-addressed blob cache: files in a (memory-backed) folder, LRU, pinned while used.

Workers read blobs straight from these files, so a cached blob never crosses the worker
pipe. Bookkeeping runs on the event loop thread; only file writes go to threads.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from dataclasses import dataclass

from .tempdirs import make_owned_dir, sweep_stale


@dataclass
class _Entry:
    size: int
    pins: int = 0
    stale: bool = False  # its file was found rewritten: treated as absent, removed when unpinned


def memory_dir(min_free_bytes: int = 2 << 30) -> str | None:
    """/dev/shm when it is writable and roomy (containers often give it only 64 MiB)."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if not os.access(shm, os.W_OK) or st.f_bavail * st.f_frsize < min_free_bytes:
        return None
    return shm


BLOB_DIR_PREFIX = "kcoral-blobs-"


def default_blob_dir(parent: str | None, fallback_root: str) -> str:
    """A fresh owned folder under `parent` (default: /dev/shm if roomy, else `fallback_root`)."""
    parent = parent or memory_dir() or fallback_root
    sweep_stale(parent, BLOB_DIR_PREFIX)
    return make_owned_dir(BLOB_DIR_PREFIX, parent)


class BlobStore:
    def __init__(self, directory: str, capacity_bytes: int) -> None:
        self.directory = directory
        self.capacity = capacity_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        os.makedirs(directory, mode=0o700, exist_ok=True)

    # ------------------------------------------------------------------ queries
    def path(self, digest: str) -> str:
        return os.path.join(self.directory, digest)

    def has(self, digest: str) -> bool:
        entry = self._entries.get(digest)
        return entry is not None and not entry.stale

    def is_stale(self, digest: str) -> bool:
        entry = self._entries.get(digest)
        return entry is not None and entry.stale

    def size(self, digest: str) -> int:
        return self._entries[digest].size

    def missing(self, digests: list[str]) -> list[str]:
        return [d for d in digests if not self.has(d)]

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------------ updates
    def write_file(self, digest: str, data: memoryview | bytes, replace: bool = False) -> None:
        """Thread-safe part: write the blob's file (atomically) without registering it;
        `replace` writes a new file even if one exists (a rewritten one)."""
        final = self.path(digest)
        if os.path.exists(final) and not replace:
            return
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o400)  # nobody writes a cached blob, its owner included
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def register(self, digest: str, size: int) -> None:
        if digest in self._entries:
            self._entries[digest].stale = False
            self._entries.move_to_end(digest)
            return
        self._entries[digest] = _Entry(size)
        self._bytes += size  # eviction waits for trim(), so a request can pin what it just sent

    def pin(self, digests: list[str]) -> None:
        for d in digests:
            self._entries[d].pins += 1
            self._entries.move_to_end(d)

    def unpin(self, digests: list[str]) -> None:
        for d in digests:
            entry = self._entries.get(d)
            if entry is not None:
                entry.pins -= 1
                if entry.stale and entry.pins <= 0:
                    self._remove(d)
        self.trim()

    def discard(self, digest: str) -> None:
        """A worker found this blob's file rewritten (possible where programs share the
        server's uid): later requests miss it and send it again."""
        entry = self._entries.get(digest)
        if entry is None:
            return
        entry.stale = True
        if entry.pins <= 0:
            self._remove(digest)

    def _remove(self, digest: str) -> None:
        entry = self._entries.pop(digest)
        self._bytes -= entry.size
        try:
            os.unlink(self.path(digest))
        except OSError:
            pass

    def trim(self) -> None:
        """Evict least recently used unpinned blobs until the cache fits its capacity."""
        if self._bytes <= self.capacity:
            return
        for digest in list(self._entries):
            if self._bytes <= self.capacity:
                break
            if self._entries[digest].pins > 0:
                continue
            self._remove(digest)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

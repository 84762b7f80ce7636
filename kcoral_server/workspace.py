"""Per-request working directories and link-safe file access inside them.

Every path is walked one component at a time with `dir_fd` and O_NOFOLLOW (the opens of
`kcoral.runners.sandboxed`), so a symbolic link planted by earlier program code can never
redirect a write or a read outside the workspace. Used by the worker (files in and out)
and the server (removing folders).
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from kcoral.runners.sandboxed import NotRegularFile, normalize_path, open_dir, open_read, open_write
from kcoral.values import FileValue, FolderValue


class WorkspaceError(ValueError):
    """A path the workspace rules refuse (a link, a special file, a missing file)."""


class BlobCorrupted(WorkspaceError):
    """A cached blob whose bytes no longer match its digest (rewritten since it was cached)."""

    def __init__(self, message: str, digest: str | None) -> None:
        super().__init__(message)
        self.digest = digest


@dataclass(frozen=True)
class BlobRef:
    """A cached blob as a worker sees it: a read-only descriptor, and the digest to check
    its bytes against when the program could have rewritten the file (`None`: it could not,
    the file belongs to another uid)."""

    fd: int
    verify: str | None = None


def read_blob(blob: BlobRef, writable: bool = False) -> bytes | bytearray:
    """The blob's bytes, copied once (read at explicit offsets: one descriptor may serve
    several uploads); a bytearray when the caller needs to write into it (a tensor)."""
    size = os.fstat(blob.fd).st_size
    data: bytes | bytearray
    if writable:
        data = bytearray(size)
        view = memoryview(data)
        offset = 0
        while offset < size:
            n = os.preadv(blob.fd, [view[offset:]], offset)
            if n == 0:
                raise BlobCorrupted(f"cached blob {blob.verify or ''} shrank while being read", blob.verify)
            offset += n
    else:
        chunks: list[bytes] = []
        offset = 0
        while offset < size:
            chunk = os.pread(blob.fd, min(size - offset, 1 << 30), offset)
            if not chunk:
                raise BlobCorrupted(f"cached blob {blob.verify or ''} shrank while being read", blob.verify)
            chunks.append(chunk)
            offset += len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if blob.verify is not None and hashlib.sha256(data).hexdigest() != blob.verify:
        raise BlobCorrupted(f"cached blob {blob.verify} does not match its digest (it was rewritten); "
                            "the server dropped it, send it again", blob.verify)
    return data


def remove_tree(path: str) -> None:
    """Remove a request directory even if the program made parts of it unwritable or
    unreadable (mode 0: a server that is not root can neither list nor empty it)."""
    _remove_tree(path, set())


def _remove_tree(path: str, relisted: set[str]) -> None:
    def fix(func: Any, p: str, _exc: Any) -> None:
        # Make `p` ours again and redo what failed. rmtree reports a directory it could not
        # list with os.open or os.scandir (which need more than a path to call again): list
        # it anew, once, as a tree of its own.
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                if func in (os.open, os.scandir) and p not in relisted:
                    relisted.add(p)
                    _remove_tree(p, relisted)
                else:
                    os.rmdir(p)
            else:
                os.unlink(p)
        except OSError:
            pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=fix)
    else:
        shutil.rmtree(path, onerror=fix)


def _walk(root: str | int, parts: list[str], create: bool) -> int:
    """Open the directory `root/parts...` without following links; caller closes the fd."""
    try:
        return open_dir(root, parts, create=create)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise WorkspaceError(f"{exc.filename!r} is a symbolic link or not a directory") from None
        if exc.errno == errno.ENOENT:
            raise WorkspaceError(f"directory {exc.filename!r} does not exist") from None
        raise


def write_file_from(root: str, relpath: str, source: BlobRef) -> None:
    """Materialise the blob's bytes at root/relpath (mode 0600, parents 0700)."""
    parts = normalize_path(relpath, error=WorkspaceError).split("/")
    dfd = _walk(root, parts[:-1], create=True)
    try:
        try:
            out = open_write(parts[-1], dir_fd=dfd, exclusive=False)
        except NotRegularFile:
            raise WorkspaceError(f"{relpath!r} exists and is not a regular file") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise WorkspaceError(f"{relpath!r} exists and is not a regular file") from None
            raise
    finally:
        os.close(dfd)
    try:
        os.fchmod(out, 0o600)
        if source.verify is not None:  # checked in memory, so what is checked is what is written
            data = read_blob(source)
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            return
        size = os.fstat(source.fd).st_size
        offset = 0
        while offset < size:
            sent = os.sendfile(out, source.fd, offset, size - offset)
            if sent == 0:
                break
            offset += sent
    finally:
        os.close(out)


def _read_at(dfd: int, name: str, shown: str) -> bytes:
    try:
        fd = open_read(name, dir_fd=dfd)
    except NotRegularFile:
        raise WorkspaceError(f"{shown!r} is not a regular file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WorkspaceError(f"{shown!r} is a symbolic link") from None
        if exc.errno == errno.ENOENT:
            raise WorkspaceError(f"{shown!r} does not exist") from None
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read()


def read_file(root: str, relpath: str) -> FileValue:
    parts = normalize_path(relpath, error=WorkspaceError).split("/")
    dfd = _walk(root, parts[:-1], create=False)
    try:
        return FileValue(_read_at(dfd, parts[-1], relpath))
    finally:
        os.close(dfd)


def read_folder(root: str, relpath: str) -> FolderValue:
    """Snapshot a folder: regular files and directories only; links or specials fail."""
    norm = normalize_path(relpath, allow_root=True, error=WorkspaceError)
    dfd = _walk(root, norm.split("/") if norm else [], create=False)
    folder = FolderValue()
    try:
        _collect(dfd, "", folder)
    finally:
        os.close(dfd)
    return folder


def _collect(dfd: int, prefix: str, folder: FolderValue) -> None:
    with os.scandir(dfd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        if entry.is_symlink():
            raise WorkspaceError(f"{rel!r} is a symbolic link")
        if entry.is_dir(follow_symlinks=False):
            folder.directories.append(rel)
            sub = _walk(dfd, [entry.name], create=False)
            try:
                _collect(sub, rel + "/", folder)
            finally:
                os.close(sub)
        elif entry.is_file(follow_symlinks=False):
            folder.files[rel] = _read_at(dfd, entry.name, rel)
        else:
            raise WorkspaceError(f"{rel!r} is a special file")

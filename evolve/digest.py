"""The one content digest of a candidate folder, and the check that a folder still holds it.

Rendered candidates are named by this digest and agent candidates are registered under it,
so a rendered folder registered as-is is the same candidate. A stage never runs the folder
itself: it runs a private copy written from the very bytes digested (`snapshot`), refused
unless they are the sources the candidate was registered with. An edited folder is a new
candidate, and a file swapped while a stage reads the folder changes nothing that runs.
Folders are read through directory descriptors, never through a link.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from evolve.vocabulary import FailureKind

PARAMS_FILE = "params.json"        # rendering metadata, not sources: left out of the digest
IGNORED_DIRS = frozenset({"__pycache__"})


class DigestError(ValueError):
    """A folder that cannot be a candidate (not a directory, links, special files)."""


class SourcesChanged(RuntimeError):
    """The candidate's folder no longer holds the sources it was registered with."""

    kind = FailureKind.CHECK  # the failure kind a stage records for it


def _open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise DigestError(f"{name} is not a directory (or is a symbolic link)") from None
        raise


def _files(root: Path) -> list[tuple[str, ...]]:
    """Every file's path components beneath `root`, ordered by them. Walked through
    directory descriptors without following a link: a folder swapped for a link mid-walk
    is refused, not followed out of the candidate."""
    found: list[tuple[str, ...]] = []

    def walk(fd: int, parts: tuple[str, ...]) -> None:
        for name in sorted(os.listdir(fd)):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            where = root.joinpath(*parts, name)
            if stat.S_ISLNK(st.st_mode):
                raise DigestError(f"{where} is a symbolic link; copy the file instead")
            if stat.S_ISDIR(st.st_mode):
                if name in IGNORED_DIRS:
                    continue
                sub = _open_dir(name, dir_fd=fd)
                try:
                    walk(sub, (*parts, name))
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                found.append((*parts, name))
            else:
                raise DigestError(f"{where} is not a regular file")

    top = _open_dir(root)
    try:
        walk(top, ())
    finally:
        os.close(top)
    return sorted(found)


def _open_file(root: Path, parts: tuple[str, ...]) -> tuple[int, os.stat_result]:
    """(descriptor, stat) of a regular file beneath `root`, its folders opened one by one
    without following a link (nothing outside the candidate is ever read)."""
    fd = _open_dir(root)
    try:
        for name in parts[:-1]:
            sub = _open_dir(name, dir_fd=fd)
            os.close(fd)
            fd = sub
        try:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise DigestError(f"{root.joinpath(*parts)} is a symbolic link; copy the file instead") from None
            raise
    finally:
        os.close(fd)
    st = os.fstat(f)
    if not stat.S_ISREG(st.st_mode):
        os.close(f)
        raise DigestError(f"{root.joinpath(*parts)} is not a regular file")
    return f, st


def _chunks(fd: int, size: int) -> Iterator[bytes]:
    """The file's `size` bytes (what fstat said when it was opened); a file that grew or
    shrank meanwhile is refused, so a length prefix never disagrees with the bytes."""
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        left -= len(chunk)
        yield chunk
    if left != 0 or os.read(fd, 1):
        raise DigestError("a file changed size while it was read")


def source_digest(root: str | Path, exclude: tuple[str, ...] = (PARAMS_FILE,)) -> str:
    """SHA-256 over every file's relative path and bytes (params.json and __pycache__ left out)."""
    return _copy_and_digest(Path(root), None, exclude)


def _copy_and_digest(root: Path, dest: Path | None, exclude: tuple[str, ...] = (PARAMS_FILE,)) -> str:
    """The digest of `root`; with `dest`, every digested file is also written there from the
    very bytes hashed (params.json, not digested, is not copied)."""
    h = hashlib.sha256()
    for parts in _files(root):
        rel = "/".join(parts)
        if rel in exclude and dest is not None:
            continue  # not digested, so not copied: nothing unchecked reaches a stage
        fd, st = _open_file(root, parts)
        size = st.st_size
        try:
            out = None
            if dest is not None:
                target = dest.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                out = open(target, "xb")
                os.fchmod(out.fileno(), 0o755 if st.st_mode & 0o111 else 0o644)  # a helper script stays runnable
            try:
                if rel not in exclude:
                    # Length-prefix both fields so no two different trees hash alike.
                    h.update(f"{len(rel)}:{rel}:{size}:".encode())
                for chunk in _chunks(fd, size):
                    if rel not in exclude:
                        h.update(chunk)
                    if out is not None:
                        out.write(chunk)
            finally:
                if out is not None:
                    out.close()
        finally:
            os.close(fd)
    return h.hexdigest()


def _legacy_register_digest(root: Path) -> str:
    # Agent candidates registered before the digest was unified carry this one; it is only
    # read here so that their rows stay usable, never written.
    h = hashlib.sha256()
    for rel, parts in sorted(("/".join(p), p) for p in _files(root)):
        fd, st = _open_file(root, parts)
        try:
            data = b"".join(_chunks(fd, st.st_size))
        finally:
            os.close(fd)
        name = rel.encode()
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def snapshot(directory: Path, expected: str, parent: Path, *, candidate_id: int | None = None) -> Path:
    """A private copy of the candidate's folder, written from the same bytes its digest is
    computed from, in `parent` under the folder's own name; SourcesChanged unless that
    digest is `expected`. params.json is left out (a candidate could change it unseen);
    the caller writes it from the candidate's record. A stage runs the copy, never the
    folder: checking the folder and then reading it again left a window in which an agent
    swapped a file, and the server ran sources other than those the leaderboard credits
    (seen in 4 of 25 stages)."""
    who = f"candidate {candidate_id}" if candidate_id is not None else "the candidate"
    dest = parent / directory.name
    try:
        dest.mkdir(mode=0o700)
        now = _copy_and_digest(directory, dest)
        if now == expected or _legacy_register_digest(dest) == expected:
            return dest
    except (DigestError, OSError) as exc:
        raise SourcesChanged(f"the sources of {who} can't be read at {directory}: {exc}") from None
    raise SourcesChanged(
        f"{directory} changed since registration of {who} (digest {expected[:12]}, now {now[:12]}); "
        f"its recorded results are for the old sources: run `evolve register {directory}` to add the "
        f"edited folder as a new candidate")

"""The one content digest of a candidate folder, and the check that a folder still holds it.

Rendered candidates are named by this digest and agent candidates are registered under it,
so a rendered folder registered as-is is the same candidate. A stage runs a candidate's
folder as it is on disk, so every stage first checks that the folder still holds the
sources the candidate was registered with: an edited folder is a new candidate.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from evolve.vocabulary import FailureKind

PARAMS_FILE = "params.json"        # rendering metadata, not sources: left out of the digest
IGNORED_DIRS = frozenset({"__pycache__"})


class DigestError(ValueError):
    """A folder that cannot be a candidate (not a directory, links, special files)."""


class SourcesChanged(RuntimeError):
    """The candidate's folder no longer holds the sources it was registered with."""

    kind = FailureKind.CHECK  # the failure kind a stage records for it


def _files(root: Path) -> list[tuple[str, Path]]:
    if root.is_symlink() or not root.is_dir():
        raise DigestError(f"{root} is not a directory")
    files: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in dirnames:
            if (here / name).is_symlink():
                raise DigestError(f"{here / name} is a symbolic link; copy the files instead")
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in filenames:
            path = here / name
            if path.is_symlink():
                raise DigestError(f"{path} is a symbolic link; copy the file instead")
            if not path.is_file():
                raise DigestError(f"{path} is not a regular file")
            files.append((path.relative_to(root).as_posix(), path))
    # Ordered by path components, as rendered folders were always named: their names stay valid.
    return sorted(files, key=lambda item: item[1].relative_to(root).parts)


def source_digest(root: str | Path, exclude: tuple[str, ...] = (PARAMS_FILE,)) -> str:
    """SHA-256 over every file's relative path and bytes (params.json and __pycache__ left out)."""
    h = hashlib.sha256()
    for rel, path in _files(Path(root)):
        if rel in exclude:
            continue
        data = path.read_bytes()
        # Length-prefix both fields so no two different trees hash alike.
        h.update(f"{len(rel)}:{rel}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def _legacy_register_digest(root: Path) -> str:
    # Agent candidates registered before the digest was unified carry this one; it is only
    # read here so that their rows stay usable, never written.
    h = hashlib.sha256()
    for rel, path in sorted(_files(root)):
        data = path.read_bytes()
        name = rel.encode()
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def verify_sources(directory: Path, expected: str, *, candidate_id: int | None = None) -> None:
    """Raise SourcesChanged unless `directory` still holds the sources digested as `expected`."""
    who = f"candidate {candidate_id}" if candidate_id is not None else "the candidate"
    try:
        now = source_digest(directory)
    except (DigestError, OSError) as exc:
        raise SourcesChanged(f"the sources of {who} can't be read at {directory}: {exc}") from None
    if now == expected or _legacy_register_digest(directory) == expected:
        return
    raise SourcesChanged(
        f"{directory} changed since registration of {who} (digest {expected[:12]}, now {now[:12]}); "
        f"its recorded results are for the old sources: run `evolve register {directory}` to add the "
        f"edited folder as a new candidate")

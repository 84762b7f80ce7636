"""One install at a time into a shared cache directory.

The released packages are installed once into a cache outside the repository and reused.
pytest-xdist's workers (and two test runs on one machine) reach an empty cache together;
without a lock both would install into, or rename over, the same directory while the
other's tests import from it.
"""
from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def install_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock for installing `target` (a sibling lock file; released on exit,
    or by the kernel if the holder dies)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield

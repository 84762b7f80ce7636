"""Private scratch folders owned by one server process, and cleanup of ones left behind.

A server killed with SIGKILL cannot remove its blob cache or request folders (often on
/dev/shm, i.e. memory), so each folder records its owner's pid and the next server
removes folders whose owner is gone.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from kcoral.runners.sandboxed import open_write, read_regular

OWNER_FILE = ".kcoral-owner"


def make_owned_dir(prefix: str, parent: str | None) -> str:
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    with os.fdopen(open_write(os.path.join(path, OWNER_FILE), mode=0o644), "w") as f:
        f.write(str(os.getpid()))
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(parent: str | None, prefix: str) -> int:
    """Remove `prefix*` folders under `parent` whose owner process no longer exists."""
    parent = parent or tempfile.gettempdir()
    removed = 0
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix):
            continue
        path = os.path.join(parent, name)
        try:  # a shared parent (/dev/shm): a link or a FIFO put there is neither followed nor waited on
            pid = int(read_regular(os.path.join(path, OWNER_FILE), limit=64).strip())
        except (OSError, ValueError):
            continue  # not ours, or still being created: leave it
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed

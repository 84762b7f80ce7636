"""The sandbox uids a server runs its programs as (as root): one range per server on a host.

Worker slot i's programs run as uid base + i, and RLIMIT_NPROC counts a uid's processes
host-wide: two servers on one host with the same range shared one budget, so a request of
one could fork until the other's requests could not start a process (red team: 250 forks
on one server left the same slot of another with EAGAIN). So each server claims its range
with a lock held for its life: the first free one of DEFAULT_BASE, + RANGE, + 2 RANGE, ...
or the one `--sandbox-uid` names, refused if another server holds it.
"""
from __future__ import annotations

import fcntl
import os
import tempfile

DEFAULT_BASE = 2_000_000_000  # no real or subordinate uid lives up here
RANGE = 1024                  # uids a range spans: more than any server's slots
TRIES = 1000


class UidRangeTaken(RuntimeError):
    """The `--sandbox-uid` range is held by another server on this host."""


def _lock_dir() -> str:
    for parent in ("/run", tempfile.gettempdir()):
        path = os.path.join(parent, "kcoral-server-uids")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            return path
        except OSError:
            continue
    raise OSError("no folder for the sandbox uid locks (/run, $TMPDIR)")


def claim(base: int | None, slots: int) -> tuple[int, int]:
    """(the range's first uid, the lock's descriptor: keep it open while the server runs)."""
    if slots > RANGE:
        raise ValueError(f"{slots} worker slots need more than the {RANGE} uids of a range")
    directory = _lock_dir()
    for first in [base] if base is not None else [DEFAULT_BASE + k * RANGE for k in range(TRIES)]:
        fd = os.open(os.path.join(directory, f"{first}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return first, fd
    if base is not None:
        raise UidRangeTaken(f"sandbox uids {base}..{base + slots - 1} are used by another kcoral-server on this "
                            "host (their process limits would be shared): pass another --sandbox-uid, or none")
    raise UidRangeTaken(f"every sandbox uid range from {DEFAULT_BASE} ({TRIES} of {RANGE}) is held by a server")

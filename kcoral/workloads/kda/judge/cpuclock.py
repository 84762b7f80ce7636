"""The CPU twin's clock: CPU time, not wall time.

On a shared CPU machine wall time measures the machine's load as much as the candidate:
on two cores running other work, one call's wall time swung by 40-140 % from trial to
trial while its CPU time held. So on the CPU the host times each call with its process's
CPU clock (every thread, live or gone), and the judge weighs those times against its own
reading of the CPU clocks of every process it started (the hosts and anything they
started), taken around the batch.

That reading is complete only if no process or thread came or went during the batch: a
helper that did work and was reaped takes its CPU time out of every live clock. So a
reading stands only when the set of the judge's descendants is the same on both sides of
the batch and no task was created in between (the pid namespace's last pid, from
/proc/loadavg, did not move); otherwise `between` gives None and the judge falls back to
its wall clock for that batch.

CPU time only counts the work of processes the judge can read, so the CPU clock is used
only inside the server's bubblewrap sandbox (KCORAL_SANDBOX=bwrap, set by the server for
its workers): there the request's own pid and network namespaces hold every process a
candidate can reach, all of them the judge's. Elsewhere (a server run with --sandbox none,
a stock KCoral server, the judge run by hand) a candidate could hand its work to a process
started beforehand outside the judge's tree and wait for the answer, which costs no CPU
time of its own: the wall clock is used there."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from . import sandboxed

CPUCLOCK_SCHED = 2  # Linux: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), every thread of the process


@dataclass(frozen=True)
class Reading:
    last_pid: int
    pids: tuple[int, ...]
    cpu_ns: int | None


def _last_pid() -> int:
    with open("/proc/loadavg") as fh:
        return int(fh.read().split()[-1])


def _process_cpu_ns(pid: int) -> int:
    return time.clock_gettime_ns(((~pid) << 3) | CPUCLOCK_SCHED)


def read() -> Reading:
    last = _last_pid()
    pids = tuple(sorted(sandboxed.descendants(os.getpid())))
    total: int | None = 0
    try:
        total = sum(_process_cpu_ns(pid) for pid in pids)
    except OSError:  # a process ended while it was read
        total = None
    return Reading(last, pids, total)


def between(before: Reading, after: Reading) -> float | None:
    """CPU ms every descendant spent from `before` to `after`, or None if tasks came or went."""
    if before.cpu_ns is None or after.cpu_ns is None:
        return None
    if before.pids != after.pids or after.last_pid != before.last_pid:
        return None
    return (after.cpu_ns - before.cpu_ns) / 1e6


def available() -> bool:
    """Use the CPU clock: inside the server's bubblewrap sandbox, where it is supported."""
    return os.environ.get("KCORAL_SANDBOX") == "bwrap" and supported()


def supported() -> bool:
    """Linux with per-process CPU clocks readable for a child (tried once, on ourselves)."""
    if not _ok:
        try:
            _process_cpu_ns(os.getpid())
            _last_pid()
            _ok.append(True)
        except (OSError, ValueError, IndexError):
            _ok.append(False)
    return _ok[0]


_ok: list[bool] = []

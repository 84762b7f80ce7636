"""Which CPUs each worker slot's programs may run on.

A request that forks CPU burners up to its process limit must not starve the others.
Where the server runs in the root cgroup, the scheduler's per-session fairness already
bounds it (each request stays in its worker's session); inside a container's cgroup,
where most servers run, it does not, and a quarter of the traffic being hostile cut the
rest to a seventh of its throughput on a 16-core machine. So each slot gets its own share
of the CPUs the server may use, and its programs cannot widen it (see privs)."""
from __future__ import annotations

import os


def available() -> list[int]:
    """The CPUs this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def partition(cpus: list[int], slots: int) -> list[tuple[int, ...]]:
    """Split `cpus` into `slots` contiguous groups as even as can be (neighbouring CPUs
    often share a core's caches). With more slots than CPUs, slot i gets CPU i mod n: each
    CPU is then shared by as few slots as possible."""
    if slots <= 0:
        return []
    if not cpus:
        raise ValueError("no CPUs to share")
    n = len(cpus)
    if slots >= n:
        return [(cpus[i % n],) for i in range(slots)]
    return [tuple(cpus[i * n // slots:(i + 1) * n // slots]) for i in range(slots)]

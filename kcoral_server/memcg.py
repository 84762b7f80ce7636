"""A memory cgroup per request: what all of a request's processes hold together, bounded.

RLIMIT_AS bounds one process's address space, and a request may run up to
`--max-processes` processes: together they could hold that many times the limit, plus the
pages of its tmpfs, and push the machine into the kernel's OOM killer, which may then pick
the server or the other slot's request. So each worker is moved, once it is ready and
before it receives its program, into a cgroup of its own under one the server makes at
start; every process the program forks inherits it. Over the request's limit the kernel
reclaims, then kills the cgroup's largest process, and nothing outside it.

Either hierarchy: cgroup v1's memory controller, or v2 where the server's cgroup is its
own and writable (the server moves into a leaf of it, then hands `memory` down: _delegate).
Where neither works (an unprivileged server, a cgroup shared with other processes) the
server logs why once and runs without it.
"""
from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .reqlog import log_event

PREFIX = "kcoral-server-"   # the server's folder: kcoral-server-<pid>
SERVER_LEAF = "server"      # cgroup v2: where the server itself moves (see _delegate)
GiB = 1 << 30


@dataclass(frozen=True)
class _Layout:
    """Where the memory controller is, and its file names in that hierarchy."""

    version: int
    own: Path  # the server's own cgroup

    @property
    def limit_file(self) -> str:
        return "memory.limit_in_bytes" if self.version == 1 else "memory.max"

    @property
    def swap_file(self) -> str:
        return "memory.memsw.limit_in_bytes" if self.version == 1 else "memory.swap.max"

    @property
    def events_file(self) -> str:
        return "memory.oom_control" if self.version == 1 else "memory.events"


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root within its hierarchy, mount point, type, options) of every cgroup mount we
    see, from mountinfo: in a container the mount's root is the container's own cgroup, not
    the hierarchy's, and /proc/self/cgroup's paths start from the hierarchy's."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            head, _, tail = line.partition(" - ")
            fields, rest = head.split(), tail.split()
            if len(fields) >= 6 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                found.append((_unescape(fields[3]), _unescape(fields[4]), rest[0],
                              set(rest[2].split(",")) | set(fields[5].split(","))))
    return found


def _unescape(field: str) -> str:
    return field.replace("\\040", " ")  # mountinfo's spelling of a space


def _own_paths() -> dict[str, str]:
    """/proc/self/cgroup as {controller or "" for v2: path}."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _beneath(point: str, root: str, path: str) -> Path | None:
    """Where `path` (from the hierarchy's root) is under a mount of `root` at `point`."""
    rel = os.path.relpath(path, root)
    return None if rel.startswith("..") else Path(point) / ("" if rel == "." else rel)


def _locate() -> _Layout:
    """The hierarchy that has the memory controller, and our cgroup in it."""
    mounts, own = _mounts(), _own_paths()
    for root, point, kind, options in mounts:
        if kind == "cgroup" and "memory" in options and "memory" in own:
            if (path := _beneath(point, root, own["memory"])) is not None:
                return _Layout(1, path)
    for root, point, kind, _ in mounts:
        if kind == "cgroup2" and "" in own and (path := _beneath(point, root, own[""])) is not None:
            if "memory" in (path / "cgroup.controllers").read_text().split():
                return _Layout(2, path)
    raise OSError(errno.ENOENT, "no cgroup hierarchy with the memory controller is mounted where we are")


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _machine_bytes(layout: _Layout) -> int:
    """The memory this server may use: the machine's, or its own cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        text = (layout.own / layout.limit_file).read_text().strip()
        if text.isdigit():
            total = min(total, int(text))
    except OSError:
        pass
    return total


def default_limit(total_bytes: int, slots: int) -> int:
    """Three quarters of the memory shared by the slots (a quarter left to the server, its
    blob cache and the system), at least 1 GiB."""
    return max(GiB, total_bytes * 3 // 4 // max(1, slots) // (1 << 20) * (1 << 20))


class RequestCgroups:
    """The server's folder of request cgroups (kcoral-server-<pid> under its own cgroup)."""

    def __init__(self, layout: _Layout, root: Path, limit_bytes: int) -> None:
        self.layout = layout
        self.root = root
        self.limit_bytes = limit_bytes
        self._count = 0

    @property
    def version(self) -> int:
        return self.layout.version

    @classmethod
    def open(cls, limit_bytes: int | None, slots: int) -> "RequestCgroups | None":
        """None (and a warning) where no memory cgroup can be made; `limit_bytes` None: the
        default share of this machine's memory."""
        try:
            layout = _locate()
            if limit_bytes is None:
                limit_bytes = default_limit(_machine_bytes(layout), slots)
            _sweep(layout.own)
            root = layout.own / f"{PREFIX}{os.getpid()}"
            root.mkdir(exist_ok=True)
            if layout.version == 2:
                _delegate(layout.own, root)
            self = cls(layout, root, limit_bytes)
            self.new("probe").remove()  # a limit that cannot be set fails here, not per request
            return self
        except OSError as exc:
            log_event("request_memory_unbounded", reason=f"no memory cgroup per request: {exc}")
            return None

    def new(self, name: str) -> "RequestCgroup":
        self._count += 1
        path = self.root / f"{name}-{self._count}"
        path.mkdir()
        try:
            _write(path / self.layout.limit_file, str(self.limit_bytes))
            swap = path / self.layout.swap_file
            if swap.exists():  # no swapping past the limit (absent without swap accounting)
                _write(swap, str(self.limit_bytes) if self.layout.version == 1 else "0")
        except OSError:
            _rmdir(path)
            raise
        return RequestCgroup(path, self.layout)

    def close(self) -> None:
        """The request cgroups; on v2 the folder itself stays while the server lives in its
        leaf (the next server's sweep removes it)."""
        for child in self.root.iterdir():
            if child.is_dir() and child.name != SERVER_LEAF:
                _rmdir(child, 20)
        _rmdir(self.root)

    def describe(self) -> dict[str, object]:
        return {"version": self.version, "limit_bytes": self.limit_bytes}


def _delegate(own: Path, root: Path) -> None:
    """cgroup v2: hand `memory` down to the request cgroups under `root`. A cgroup with
    processes in it may not hand controllers down (only the hierarchy's root may), and ours
    holds the server: so the server moves into a leaf of its own, `root/server`, first.
    Where other processes share our cgroup (a shell, the orchestrator that started an
    embedded server) the hand-down is refused and the server moves back."""
    controllers = (own / "cgroup.subtree_control").read_text().split()
    leaf = root / SERVER_LEAF
    leaf.mkdir(exist_ok=True)
    _write(leaf / "cgroup.procs", str(os.getpid()))
    try:
        if "memory" not in controllers:
            _write(own / "cgroup.subtree_control", "+memory")
        _write(root / "cgroup.subtree_control", "+memory")
    except OSError as exc:
        _write(own / "cgroup.procs", str(os.getpid()))
        _rmdir(leaf, 20)
        if exc.errno != errno.EBUSY:
            raise
        # Seen on a GPU host whose job runner keeps its own processes in the cgroup it
        # starts commands in (2026-12-05): say what the operator can change.
        raise OSError(exc.errno, f"cgroup v2 refused to hand `memory` down from {own}: other "
                      "processes share the server's cgroup; start the server in a cgroup of its "
                      "own (a systemd unit or `systemd-run --scope` with Delegate=yes)") from exc


class RequestCgroup:
    """One request's cgroup."""

    def __init__(self, path: Path, layout: _Layout) -> None:
        self.path = path
        self.layout = layout

    def add(self, pid: int) -> None:
        """Move a process (with its threads) in; what it forks afterwards is born inside."""
        _write(self.path / "cgroup.procs", str(pid))

    def oom_kills(self) -> int:
        """Processes the kernel killed for this cgroup's limit (0 if unreadable)."""
        try:
            for line in (self.path / self.layout.events_file).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
        except OSError:
            pass
        return 0

    def remove(self, attempts: int = 50) -> bool:
        """rmdir, once the killed processes have left (they do as they exit; 10 ms a try)."""
        return _rmdir(self.path, attempts)


def _rmdir(path: Path, attempts: int = 1) -> bool:
    for i in range(attempts):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or i == attempts - 1:
                return False
            time.sleep(0.01)
    return False


def _remove_tree(root: Path) -> bool:
    """A server's folder and its request cgroups, where no process is left in them."""
    try:
        children = [p for p in root.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return True
    except OSError:
        return False
    ok = all([_rmdir(child, 20) for child in children])
    return _rmdir(root, 20) and ok


def _sweep(own: Path) -> None:
    """Folders left by servers that died without removing theirs."""
    for entry in own.glob(f"{PREFIX}*"):
        pid = entry.name[len(PREFIX):]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            _remove_tree(entry)

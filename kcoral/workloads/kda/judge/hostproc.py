"""Host processes, judge side: start one with nothing of the judge's (a scrubbed
environment, no inherited descriptor but its channel and its log, its own process group
- not a session: a server's sandbox may refuse setsid -, the unprivileged uid when the
judge is root), ask it things, and kill it with everything it started.

The judge is a child subreaper, so whatever a host leaves behind (double forks, setsid
daemons) is re-parented to the judge and swept when the host is closed: nothing of a
candidate runs while another process is timed."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Any
from pathlib import Path

from . import sandboxed
from .channel import Channel, ChannelClosed
from .confine import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, landlock_abi, prctl
from .harness import CandidateError

UNPRIVILEGED = 65534  # nobody
LOG_TAIL = 16 * 1024
REPLY_TIMEOUT_S = 600.0
# What a host's environment keeps of the judge's: how to find Python, its packages and the
# GPU. Nothing else (no tokens, no server settings) crosses.
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
            "CUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "OMP_NUM_THREADS",
            "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "MKL_NUM_THREADS")
# On the CPU every host (baseline, null, candidate, incumbent) runs its BLAS on one thread:
# with the default pool of one thread per core, a 2-core machine that is doing anything else
# makes each call wait for a busy core, and the baseline's 64-token matmuls swung between
# 6.5 and 9.9 ms from trial to trial (docs/benchmarks.md). One thread each is the same
# footing for both sides, and the spread it leaves is the machine's, not the pool's.
CPU_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_live: dict[int, "HostProcess"] = {}


# Set once this process is the judge's own (protect_judge): only then are orphans of closed
# hosts re-parented to it, and only then is every other descendant one of the hosts' leftovers.
_subreaper: list[bool] = []


def protect_judge() -> dict:
    """The judge's own process: not dumpable (no same-uid process may read its memory or
    open its descriptors through /proc) and a subreaper of everything its hosts start."""
    got = {"non_dumpable": prctl(PR_SET_DUMPABLE, 0), "subreaper": prctl(PR_SET_CHILD_SUBREAPER, 1)}
    if got["subreaper"]:
        _subreaper.append(True)
    return got


_drop: list[bool] = []


def drops_uid() -> bool:
    """Hosts run as nobody when the judge is root and this Python runs for nobody (an
    interpreter under a private home does not): tried once."""
    if not _drop:
        ok = hasattr(os, "geteuid") and os.geteuid() == 0
        if ok:
            try:
                ok = subprocess.run([sys.executable, "-c", "import numpy"], user=UNPRIVILEGED, group=UNPRIVILEGED,
                                    extra_groups=[], cwd="/", env={"PATH": os.environ.get("PATH", "")},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=60).returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
        _drop.append(ok)
    return _drop[0]


# The server's operator may turn the confinement off (a kernel whose Landlock breaks the
# GPU driver, say); the report then says so. Programs cannot: the judge's environment is
# the server's, and a host's is scrubbed.
CONFINE_ENV = "KCORAL_JUDGE_LANDLOCK"


def confines_candidates() -> bool:
    """Whether candidates' hosts confine their writes (the kernel has Landlock, and the
    server did not turn it off)."""
    return landlock_abi() > 0 and os.environ.get(CONFINE_ENV, "1") != "0"


def isolation_text(protections: dict) -> str:
    parts = ["candidate in its own process, driven call by call (no judge code shares it)",
             "scrubbed environment, no inherited descriptors, no-new-privs"]
    if drops_uid():
        parts.append(f"uid {UNPRIVILEGED} (the judge runs as root)")
    elif hasattr(os, "geteuid") and os.geteuid() == 0:
        parts.append("the judge's uid, root (this Python cannot run as an unprivileged uid here)")
    else:
        parts.append("the judge's uid (the judge is not root)")
    if confines_candidates():
        parts.append(f"candidate writes confined to its own folders (Landlock ABI {landlock_abi()})")
    else:
        why = f"turned off by the server's {CONFINE_ENV}=0" if landlock_abi() else "no Landlock in this kernel"
        parts.append(f"candidate writes not confined ({why}): the judge's files are snapshotted before it runs, "
                     "trusted hosts and each incumbent host get fresh caches, the judge compiles in memory")
    parts.append("judge not dumpable" if protections.get("non_dumpable") else "judge dumpable (prctl unavailable)")
    parts.append(f"request sandbox: {os.environ.get('KCORAL_SANDBOX', 'unknown')}")
    return "; ".join(parts)


def _sched(tid: int) -> tuple[int, int]:
    return os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)


class Scheduling:
    """How the judge's process was scheduled when it started. A candidate's host shares the
    judge's uid, and Landlock does not cover setpriority or sched_setscheduler: it could
    lower the priority of the judge or of the baseline's host (nice 19, SCHED_IDLE), which
    no process can raise back. `seen(pid)` records a process's threads at a moment no
    candidate process exists; `lowered(pid)` names each thread now scheduled below what was
    seen of it (a thread not seen then: below the judge's start), so a library that runs a
    thread of its own at low priority from the start is no alarm."""

    WORSE = {getattr(os, "SCHED_BATCH", -1), getattr(os, "SCHED_IDLE", -1)}

    def __init__(self) -> None:
        self.seen_threads: dict[int, tuple[int, int]] = {}
        try:
            self.start = _sched(0)
        except (AttributeError, OSError):  # not Linux
            self.start = (0, -1)

    @staticmethod
    def _threads(pid: int) -> dict[int, tuple[int, int]]:
        out: dict[int, tuple[int, int]] = {}
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return out
        for tid in tids:
            try:
                out[tid] = _sched(tid)
            except OSError:
                continue  # the thread ended
        return out

    def seen(self, pid: int) -> None:
        if self.start[1] != -1:
            self.seen_threads.update(self._threads(pid))

    def lowered(self, pid: int) -> list[str]:
        if self.start[1] == -1:
            return []
        out = []
        for tid, (nice, policy) in self._threads(pid).items():
            was_nice, was_policy = self.seen_threads.get(tid, self.start)
            if nice > was_nice or (policy in self.WORSE and was_policy not in self.WORSE):
                out.append(f"thread {tid} of process {pid}: nice {was_nice} -> {nice}, policy {was_policy} -> {policy}")
        return out


class Snapshot:
    """A folder's files as they were when the judge started, before any candidate ran: the
    judge's package, the candidate, the incumbent. Every host gets its copies from here,
    never from the files on disk: a candidate's host runs under the judge's uid and, where
    the kernel cannot confine it, could have edited them since (the baseline's module or
    the incumbent's, to make them slow)."""

    def __init__(self, root: Path) -> None:
        self.files: dict[str, bytes] = {}
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                self.files[path.relative_to(root).as_posix()] = path.read_bytes()

    def write(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for rel, data in self.files.items():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


class HostProcess:
    """One host. `role` is "candidate" (loads `candidate`) or "trusted"."""

    def __init__(self, arena: Any, judge_files: Snapshot, role: str, device: str, log_dir: Path, label: str,
                 candidate: Snapshot | None = None, cache_dir: Path | None = None, preroll: str | None = None) -> None:
        self.arena, self.label, self.role = arena, label, role
        self.adopted: list = []  # its buffers the judge maps: released only once it is gone
        self.workdir = Path(tempfile.mkdtemp(prefix=f"kda-host-{label}-"))
        judge_files.write(self.workdir / "judge")
        if candidate is not None:
            candidate.write(self.workdir / "candidate")
        (self.workdir / "tmp").mkdir()
        env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
        # Compile caches of its own (the trusted host's too: the judge's could hold what a
        # candidate planted while it ran, and its home is the candidate's to write).
        cache = cache_dir or (self.workdir / "cache")
        cache.mkdir(parents=True, exist_ok=True)
        env.update(HOME=str(self.workdir), TMPDIR=str(self.workdir / "tmp"), PYTHONDONTWRITEBYTECODE="1",
                   PYTHONUNBUFFERED="1", CUPY_CACHE_DIR=str(cache / "cupy"), TRITON_CACHE_DIR=str(cache / "triton"))
        if device == "cpu":
            env.update(CPU_THREAD_ENV)
        if role == "trusted":  # its CuPy kernels never touch a file
            env["CUPY_CACHE_IN_MEMORY"] = "1"
        writable = [str(self.workdir), str(cache)] if role == "candidate" and confines_candidates() else []
        kw: dict = {}
        if drops_uid() and role == "candidate":
            for path in (self.workdir, cache):
                _chown_tree(path, UNPRIVILEGED)
            kw = dict(user=UNPRIVILEGED, group=UNPRIVILEGED, extra_groups=[])
        self.log_path = log_dir / f"host-{label}.log"
        log = open(self.log_path, "ab")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "judge.host", str(theirs.fileno()), role, device, preroll or "-", *writable],
                cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                pass_fds=(theirs.fileno(),), process_group=0, **kw)
        finally:
            theirs.close()
            log.close()
        self.chan = Channel(ours)
        self.ready = False  # its first message came: it made its backend and confined itself
        _live[self.proc.pid] = self

    @property
    def candidate_dir(self) -> str:
        return str(self.workdir / "candidate")

    def request(self, msg: dict, timeout: float = REPLY_TIMEOUT_S) -> dict:
        reply, fds = self.request_fds(msg, timeout)
        for fd in fds:  # only an alloc hands the judge anything
            os.close(fd)
        return reply

    def request_fds(self, msg: dict, timeout: float = REPLY_TIMEOUT_S) -> tuple[dict, list[int]]:
        """One request; its reply and the descriptors that came with it (the caller's to close)."""
        op = msg.get("op")
        if not self.ready:
            # Its first message says whether it started: a backend that cannot be made or a
            # confinement that failed is the server's fault ("unavailable"). No candidate code
            # has run before it, so this is the only place a candidate's host may say so.
            hello, extra = self._recv(op, timeout)
            for fd in extra:
                os.close(fd)
            if hello.get("ok") is not True:
                raise _failure(hello, ("import", "runtime", "unavailable"), "the host failed to start")
            self.ready = True
        try:
            self.chan.send(msg)
        except (BrokenPipeError, ConnectionError) as exc:
            raise CandidateError("runtime", f"the {self.label} process died before '{op}' "
                                 f"({self._exit_text()}): {exc}\n{self.log_tail(2000)}") from None
        reply, extra = self._recv(op, timeout)
        if reply.get("ok") is not True:
            for fd in extra:
                os.close(fd)
            kinds = ("import", "runtime", "unavailable") if self.role == "trusted" else ("import", "runtime")
            # A candidate's host, once ready, runs the candidate's code, which can write any
            # reply on this channel: "unavailable" from it would put its failure on the server.
            raise _failure(reply, kinds, "the host reported a failure")
        return reply, extra

    def _recv(self, op: object, timeout: float) -> tuple[dict, list[int]]:
        try:
            return self.chan.recv(timeout)
        except (ChannelClosed, BrokenPipeError, ConnectionError) as exc:
            raise CandidateError("runtime", f"the {self.label} process died during '{op}' "
                                 f"({self._exit_text()}): {exc}\n{self.log_tail(2000)}") from None
        except TimeoutError:
            raise CandidateError("runtime", f"the {self.label} process gave no answer to '{op}' "
                                 f"within {timeout:.0f} s") from None
        except ValueError as exc:  # an unreadable message: the host is not speaking the protocol
            raise CandidateError("runtime", f"the {self.label} process sent a malformed reply: {exc}") from None

    def _exit_text(self) -> str:
        try:  # its channel closed: give the process a moment to finish dying
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def log_tail(self, limit: int = LOG_TAIL) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - limit))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Kill the host's process group and everything it left behind, then reap."""
        _live.pop(self.proc.pid, None)
        try:
            if self.proc.poll() is None:
                self.chan.send({"op": "exit"})
        except OSError:
            pass
        self.chan.close()
        # It was asked to exit: no SIGTERM and grace, straight to SIGKILL of its group and tree.
        sandboxed.kill_tree(self.proc, grace_s=0)
        sweep_orphans()
        for buf in self.adopted:
            self.arena.free(buf)
        self.adopted.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _failure(reply: dict, kinds: tuple[str, ...], default: str) -> CandidateError:
    """A host's failure reply as the judge's error: its kind where it is one of `kinds`, else runtime."""
    kind = str(reply["kind"]) if reply.get("kind") in kinds else "runtime"
    return CandidateError(kind, str(reply.get("message") or default)[:8000])


def _chown_tree(path: Path, uid: int) -> None:
    os.chown(path, uid, uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def sweep_orphans() -> None:
    """Kill every descendant of the judge that is not a live host or inside one. Orphans
    of closed hosts were re-parented to the judge (its subreaper flag). A process that
    drives hosts without being the judge (a test, a benchmark script) is no subreaper:
    nothing is re-parented to it, and its other children (servers, databases) are its own,
    so nothing is swept there."""
    if _subreaper:
        sandboxed.kill_orphans(keep=set(_live))

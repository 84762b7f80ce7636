"""The zygote: a preloaded process that forks one single-use worker per request.

Starting Python and importing NumPy costs ~0.3 s of CPU, too much to pay per request;
forking a process that has already done so costs a few milliseconds. The zygote never
runs program code. For each spawn the server sends it (over a SOCK_SEQPACKET socket) a
JSON spec and the worker's file descriptors; it forks the worker, which

1. joins the request's sandbox (the namespaces of the bwrap init whose pid the spec
   names; its root becomes ours), unless the server runs with `--sandbox none`;
2. sets the limits, drops privileges and serves one program;

and writes the worker's wait status to the status pipe when it ends, so the server learns
of a crash even when a daemon the program left holds the worker's socket open.

As root the zygote forks the worker straight into the sandbox's PID namespace (it sets
the namespace for its children, forks, and sets its own back) and reports the worker's
end itself; a launcher is needed only to join a user namespace (the server is not root).
Zygote and launcher stay in the server's PID namespace, invisible to programs. Run as
`python -m kcoral_server.zygote --fd N`.
"""
from __future__ import annotations

import argparse
import array
import gc
import json
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import Any

from kcoral.runners.sandboxed import kill_orphans

from . import privs
from .privs import Namespace

MAX_SPEC = 1 << 20
# Descriptors a spawn carries, in this order.
FD_NAMES = ("chan", "fdsock", "status", "stdout", "stderr")


# ---------------------------------------------------------------------- zygote side
def _preload() -> None:
    """Import what every worker needs, so each fork starts warm. CUDA is never
    initialised here: a forked child could not use a context its parent created."""
    from . import executor, worker  # noqa: F401
    from .builtins import cpu  # noqa: F401

    for name in ("ml_dtypes", "cupy", "kcoral_server.builtins.gpu"):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - absent on CPU hosts; the worker reports it when used
            pass


def _recv_spawn(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_SPEC, len(FD_NAMES))
    if not msg:
        return None
    return json.loads(msg), fds


class _Zygote:
    """The fork loop: spawn requests on the control socket, child exits via SIGCHLD."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.workers: dict[int, int] = {}  # pid of a worker forked here -> its status pipe
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd
        # Without a PID namespace (--sandbox none) a dead worker's orphans come here: they
        # are killed (see _reap).
        privs.become_subreaper()

    def serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [])
            if self.wake_r in ready:
                while True:
                    try:
                        if not os.read(self.wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
                self._reap()
            if self.sock.fileno() in ready:
                try:
                    got = _recv_spawn(self.sock)
                except (ConnectionError, OSError):
                    return
                if got is None:
                    return
                spec, fds = got
                try:
                    if len(fds) == len(FD_NAMES):
                        self._spawn(spec, dict(zip(FD_NAMES, fds)))
                finally:
                    for fd in fds:
                        os.close(fd)

    def _spawn(self, spec: dict[str, Any], fds: dict[str, int]) -> None:
        init_pid = spec.get("init_pid")
        if init_pid and spec.get("userns"):
            # Joining a user namespace needs a single-threaded process with no capability
            # in ours: a launcher child joins, forks the worker and reports on it.
            if os.fork() == 0:
                self._child_setup()
                _launcher(spec, fds)
            return
        pidns = os.open(f"/proc/{init_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if init_pid else -1
        try:
            if pidns >= 0:
                # Our children are born in the sandbox's PID namespace (we stay in ours).
                privs.setns(pidns, Namespace.PID)
            try:
                pid = os.fork()
            finally:
                if pidns >= 0 and pid != 0:
                    privs.setns(self.own_pidns, Namespace.PID)
        finally:
            if pidns >= 0:
                os.close(pidns)
        if pid == 0:
            self._child_setup()
            code = 1
            try:
                if init_pid:
                    _join(int(init_pid), userns=False, pid=False)
                    _own_dirs(spec)
                os.chdir(spec["workdir"])
            except BaseException as exc:  # noqa: BLE001
                _report(fds["status"], f"error {type(exc).__name__}: {exc}")
                os._exit(code)
            _worker(spec, fds)  # never returns
        self.workers[pid] = os.dup(fds["status"])
        _report(self.workers[pid], f"pid {pid}")

    def _child_setup(self) -> None:
        self.sock.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (self.wake_r, self.own_pidns, *self.workers.values()):
            os.close(fd)

    def _reap(self) -> None:
        while True:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status_fd = self.workers.pop(pid, None)
            if status_fd is None:
                continue  # a launcher (it reported itself) or an orphan already dead
            # Processes a dead worker left behind (--sandbox none; with a sandbox they die
            # with its PID namespace): killed here, reaped by this loop.
            kill_orphans(keep=self.workers, reap_s=0)
            _report(status_fd, f"exit {os.waitstatus_to_exitcode(wstatus)}")
            os.close(status_fd)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kcoral_server.zygote")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args()
    privs.die_with_parent()
    privs.set_dumpable(False)
    privs.set_name("kcoral-zygote")
    _preload()
    # Objects the zygote made are shared copy-on-write with every fork: keep the garbage
    # collector from walking (and so copying) them in each child.
    gc.collect()
    gc.freeze()
    sock = socket.socket(fileno=args.fd)
    zygote = _Zygote(sock)
    sock.send(b"ready")
    zygote.serve()


# ---------------------------------------------------------------------- launcher
def _report(status_fd: int, text: str) -> None:
    try:
        os.write(status_fd, (text + "\n").encode())
    except OSError:
        pass


def _join(init_pid: int, userns: bool, pid: bool = True) -> None:
    """Enter the sandbox of bwrap's init `init_pid`: its namespaces and its root."""
    kinds = [Namespace.USER] if userns else []
    kinds += [Namespace.IPC, Namespace.UTS, Namespace.NET, Namespace.MNT] + ([Namespace.PID] if pid else [])
    nsfds = {k: os.open(f"/proc/{init_pid}/ns/{k.proc_name}", os.O_RDONLY | os.O_CLOEXEC) for k in kinds}
    root = os.open(f"/proc/{init_pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for kind in kinds:
            privs.setns(nsfds[kind], kind)
        # setns(CLONE_NEWNS) leaves us at the namespace's root mount; bwrap's sandbox root
        # lies below it.
        os.fchdir(root)
        os.chroot(".")
    finally:
        for fd in (*nsfds.values(), root):
            os.close(fd)


def _own_dirs(spec: dict[str, Any]) -> None:
    """The tmpfs's folders belong to the uid the program runs as, private to it."""
    uid, gid = spec.get("uid"), spec.get("gid")
    for d in spec.get("own_dirs", []):
        if uid is not None and gid is not None:
            os.chown(d, uid, gid)
        os.chmod(d, 0o700)


def _launcher(spec: dict[str, Any], fds: dict[str, int]) -> None:
    """User-namespace mode: join the sandbox, fork the worker into it, report its end."""
    status = fds["status"]
    code = 1
    try:
        os.setsid()
        privs.die_with_parent()
        _join(int(spec["init_pid"]), userns=True)
        _own_dirs(spec)
        os.chdir(spec["workdir"])
        worker = os.fork()
        if worker == 0:
            _worker(spec, fds)  # never returns
        _close_all_but(status)
        _report(status, f"pid {worker}")
        _, wstatus = os.waitpid(worker, 0)
        _report(status, f"exit {os.waitstatus_to_exitcode(wstatus)}")
        code = 0
    except BaseException as exc:  # noqa: BLE001 - the server reads the reason from the status pipe
        _report(status, f"error {type(exc).__name__}: {exc}")
    finally:
        os._exit(code)


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _close_all_but(*keep: int) -> None:
    """Close every descriptor of this process but `keep`."""
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:   # never an empty range: CPython falls back to closing from `low` upwards
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1 << 16))


def _worker(spec: dict[str, Any], fds: dict[str, int]) -> None:
    code = 70
    try:
        os.setsid()  # kill(0, ...) from the program reaches only its own group
        privs.set_name("kcoral-worker")
        privs.die_with_parent()
        privs.become_subreaper()  # the executor kills what a finished program left behind
        os.dup2(fds["stdout"], 1)
        os.dup2(fds["stderr"], 2)
        # Nothing else goes on into the program: the status pipe and the capture files'
        # originals, the wake pipe of the zygote's signal loop, and copies of its own stdio,
        # one of them the server's log, open for writing (a program could have written lines
        # into it).
        _close_all_but(0, 1, 2, fds["chan"], fds["fdsock"])
        limits = spec.get("limits", {})
        for res, key in ((resource.RLIMIT_AS, "memory_bytes"), (resource.RLIMIT_NPROC, "processes"),
                         (resource.RLIMIT_FSIZE, "file_bytes"), (resource.RLIMIT_NOFILE, "open_files")):
            value = int(limits.get(key) or 0)
            if value > 0:
                if res == resource.RLIMIT_AS:
                    # What the request may add to the address space it was forked with: the
                    # zygote's imports reserve far more of it on some machines than on
                    # others (CuPy's libraries, a BLAS pool sized by the core count: over
                    # 1 GiB on a 16-core GPU machine, where a 1 GiB limit refused 4 MiB).
                    value += _address_space_bytes()
                resource.setrlimit(res, (value, value))
        uid, gid = spec.get("uid"), spec.get("gid")
        if uid is not None and gid is not None:   # the pool sets both or neither
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)  # from root: every capability is gone
            # A uid change makes a process non-dumpable (its /proc files root-owned, so it
            # could not read its own /proc/self/environ); a normal process is dumpable.
            privs.set_dumpable(True)
        elif spec.get("userns"):
            privs.drop_capabilities()
        if spec.get("cpus"):
            os.sched_setaffinity(0, spec["cpus"])
        privs.set_no_new_privs()
        if spec.get("init_pid"):
            # Every process of the request stays in this session and on its slot's CPUs,
            # which bounds its CPU share however many processes it forks (cpusets.py).
            privs.confine_syscalls()
        os.environ.clear()
        os.environ.update(spec["env"])
        from .worker import serve

        serve(fds["chan"], fds["fdsock"], spec["worker_id"], spec["backend"], bool(spec.get("verify_blobs")))
        code = 0
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os._exit(code)


# ---------------------------------------------------------------------- server side
class Zygote:
    """The server's handle on its zygote process (started once, restarted if it dies).
    (asyncio is imported here, not at the top: the zygote process itself never needs it,
    and every module it imports makes each fork costlier.)"""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        import asyncio

        self.env = env
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self._lock = asyncio.Lock()

    async def _start(self) -> None:
        import asyncio

        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kcoral_server.zygote", "--fd", str(child.fileno()),
                pass_fds=(child.fileno(),), start_new_session=True, env=self.env, cwd=self.cwd,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL)
        finally:
            child.close()
        parent.setblocking(False)
        loop = asyncio.get_running_loop()
        msg = await asyncio.wait_for(loop.sock_recv(parent, 16), 120)
        if msg != b"ready":
            parent.close()
            raise RuntimeError(f"zygote sent {msg!r} instead of ready")
        self.sock = parent

    async def ensure(self) -> None:
        async with self._lock:
            if self.proc is None or self.proc.returncode is not None or self.sock is None:
                if self.sock is not None:
                    self.sock.close()
                    self.sock = None
                await self._start()

    async def spawn(self, spec: dict[str, Any], fds: dict[str, int]) -> None:
        import asyncio

        await self.ensure()
        assert self.sock is not None
        data = json.dumps(spec).encode()
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fds[n] for n in FD_NAMES]))]
        deadline = time.monotonic() + 10
        while True:
            try:
                self.sock.sendmsg([data], ancillary)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError("zygote does not accept spawns") from None
                await asyncio.sleep(0.001)

    async def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            await self.proc.wait()


if __name__ == "__main__":
    main()

"""The zygote: a preloaded process that forks one single-use worker per request.

Starting Python and importing NumPy costs ~0.3 s of CPU, too much to pay per request;
forking a process that has already done so costs about a millisecond. The zygote never
runs program code. For each spawn the server sends it (over a SOCK_SEQPACKET socket) a
JSON spec and the worker's file descriptors; it forks a *launcher*, which

1. joins the request's sandbox (the namespaces of the bwrap init whose pid the spec
   names; its root becomes ours), unless the server runs with `--sandbox none`;
2. forks the worker, which sets the limits, drops privileges and serves one program;
3. waits for the worker and writes its wait status to the status pipe, so the server
   learns of a crash even when a daemon the program left holds the worker's socket open.

The launcher stays in the server's PID namespace (setns(CLONE_NEWPID) only moves
children), so programs cannot see or signal it. Run as `python -m server.zygote --fd N`.
"""
from __future__ import annotations

import argparse
import array
import asyncio
import json
import os
import resource
import signal
import socket
import sys
import time
from typing import Any

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

    for name in ("ml_dtypes", "cupy", "server.builtins.gpu"):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - absent on CPU hosts; the worker reports it when used
            pass


def _recv_spawn(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_SPEC, len(FD_NAMES))
    if not msg:
        return None
    return json.loads(msg), fds


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m server.zygote")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args()
    privs.die_with_parent()
    privs.set_dumpable(False)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # launchers are reaped by the kernel
    _preload()
    sock = socket.socket(fileno=args.fd)
    sock.send(b"ready")
    while True:
        try:
            got = _recv_spawn(sock)
        except (ConnectionError, OSError):
            return
        if got is None:
            return
        spec, fds = got
        if len(fds) != len(FD_NAMES):
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            sock.close()
            _launcher(spec, dict(zip(FD_NAMES, fds)))  # never returns
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------------- launcher
def _report(status_fd: int, text: str) -> None:
    try:
        os.write(status_fd, (text + "\n").encode())
    except OSError:
        pass


def _join(init_pid: int, userns: bool) -> None:
    """Enter the sandbox of bwrap's init `init_pid`: its namespaces and its root."""
    kinds = [Namespace.USER] if userns else []
    kinds += [Namespace.IPC, Namespace.UTS, Namespace.NET, Namespace.MNT, Namespace.PID]
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


def _kill_descendants() -> None:
    """Without a PID namespace (`--sandbox none`): kill what the program left behind.
    The launcher is a subreaper, so orphans (double forks, setsid daemons) are its
    children; a killed process's own children come back to it, hence the rounds."""
    for _ in range(100):
        try:
            with open(f"/proc/self/task/{os.getpid()}/children") as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _launcher(spec: dict[str, Any], fds: dict[str, int]) -> None:
    status = fds["status"]
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        privs.die_with_parent()
        uid, gid = spec.get("uid"), spec.get("gid")
        if spec.get("init_pid"):
            _join(int(spec["init_pid"]), bool(spec.get("userns")))
            for d in spec.get("own_dirs", []):
                if uid is not None:
                    os.chown(d, uid, gid)
                os.chmod(d, 0o700)
        os.chdir(spec["workdir"])
        privs.become_subreaper()
        worker = os.fork()
        if worker == 0:
            _worker(spec, fds)  # never returns
        os.closerange(0, status)
        os.closerange(status + 1, 1 << 16)
        _report(status, f"pid {worker}")
        _, wstatus = os.waitpid(worker, 0)
        if not spec.get("init_pid"):
            _kill_descendants()
        _report(status, f"exit {os.waitstatus_to_exitcode(wstatus)}")
        code = 0
    except BaseException as exc:  # noqa: BLE001 - the server reads the reason from the status pipe
        _report(status, f"error {type(exc).__name__}: {exc}")
    finally:
        os._exit(code)


def _worker(spec: dict[str, Any], fds: dict[str, int]) -> None:
    code = 70
    try:
        os.setsid()  # kill(0, ...) from the program reaches only its own group
        privs.die_with_parent()
        privs.become_subreaper()  # the executor kills what a finished program left behind
        os.dup2(fds["stdout"], 1)
        os.dup2(fds["stderr"], 2)
        for name in ("status", "stdout", "stderr"):
            os.close(fds[name])
        limits = spec.get("limits", {})
        for res, key in ((resource.RLIMIT_AS, "memory_bytes"), (resource.RLIMIT_NPROC, "processes"),
                         (resource.RLIMIT_FSIZE, "file_bytes")):
            value = int(limits.get(key) or 0)
            if value > 0:
                resource.setrlimit(res, (value, value))
        uid, gid = spec.get("uid"), spec.get("gid")
        if uid is not None:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)  # from root: every capability is gone
            # A uid change makes a process non-dumpable (its /proc files root-owned, so it
            # could not read its own /proc/self/environ); a normal process is dumpable.
            privs.set_dumpable(True)
        elif spec.get("userns"):
            privs.drop_capabilities()
        privs.set_no_new_privs()
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
    """The server's handle on its zygote process (started once, restarted if it dies)."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.env = env
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self._lock = asyncio.Lock()

    async def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "server.zygote", "--fd", str(child.fileno()),
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

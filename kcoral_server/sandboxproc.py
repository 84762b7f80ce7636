"""One running sandbox: the bwrap process that holds a request's namespaces open.

Started with posix_spawn (vfork: nothing of the large server process is copied) and
watched through pidfds, so starting and ending one costs the server little; this is on
every request's path (each request gets a fresh sandbox).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal

from .fdwait import readable as _readable
from .ipcns import force_shm_removal
from .sandbox import READY, SandboxPolicy


class SandboxProcess:
    def __init__(self) -> None:
        self.pid = 0
        self._pidfd = -1        # bwrap itself (our child)
        self._init_pidfd = -1   # the sandbox's PID 1: killing it kills every process inside
        self._stdin = -1        # closing it ends the placeholder command, and the sandbox
        self.init_pid = 0
        self._reaper: asyncio.Future[None] | None = None

    @classmethod
    async def start(cls, policy: SandboxPolicy, gpu: bool, timeout: float = 60.0) -> "SandboxProcess":
        self = cls()
        info_r, info_w = os.pipe()
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        os.set_inheritable(info_w, True)  # bwrap writes its JSON there (fd number in argv)
        try:
            # In a thread: vfork suspends the calling thread until bwrap is exec'd, which
            # takes milliseconds the event loop should spend on other requests.
            self.pid = await asyncio.to_thread(
                os.posix_spawn, policy.bwrap_path, policy.bwrap_argv(gpu, info_fd=info_w), policy.bwrap_env(),
                file_actions=[(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                              (os.POSIX_SPAWN_DUP2, out_w, 2)],
                setsid=True)
        finally:
            for fd in (info_w, in_r, out_w):
                os.close(fd)
        self._pidfd = os.pidfd_open(self.pid)
        self._stdin = in_w
        try:
            os.write(in_w, READY)
            got = b""
            os.set_blocking(out_r, False)
            while not got.endswith(b"\n") and len(got) < 8192:
                await _readable(out_r, timeout)
                chunk = os.read(out_r, 8192)
                if not chunk:
                    break
                got += chunk
            if got != READY:
                raise RuntimeError(f"bwrap failed: {got.decode(errors='replace').strip() or 'no message'}")
            info = json.loads(os.read(info_r, 1 << 16))  # written before bwrap ran its command
            self.init_pid = int(info["child-pid"])
            # Taken while the sandbox is known alive: a pidfd never reaches a reused pid.
            self._init_pidfd = os.pidfd_open(self.init_pid)
            # Before any program runs in it: SysV segments die with their last attachment,
            # so no program can leave memory behind that no process limit counts.
            force_shm_removal(self.init_pid, self._init_pidfd)
        except BaseException:
            self.kill()
            await self.wait()
            raise
        finally:
            os.close(info_r)
            os.close(out_r)
        return self

    def kill(self) -> None:
        """SIGKILL the sandbox's PID 1 (so every process inside) and bwrap; never blocks."""
        for fd in (self._init_pidfd, self._pidfd):
            if fd >= 0:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._init_pidfd >= 0:
            os.close(self._init_pidfd)
            self._init_pidfd = -1
        if self._stdin >= 0:
            os.close(self._stdin)
            self._stdin = -1

    async def wait(self, timeout: float = 10.0) -> None:
        """Reap bwrap (after kill). Every caller shares one reaping: two that each watched
        and closed the pidfd closed it twice, and the second close could take a descriptor
        number already reused by another request's socket (seen on a 16-core machine under
        a hostile client: other requests failed with EBADF)."""
        if self._reaper is None:
            if self._pidfd < 0:
                return
            self._reaper = asyncio.ensure_future(self._reap(self._pidfd, timeout))
        await asyncio.shield(self._reaper)

    async def _reap(self, pidfd: int, timeout: float) -> None:
        try:
            await _readable(pidfd, timeout)
            os.waitpid(self.pid, 0)
        except (TimeoutError, ChildProcessError):
            pass
        finally:
            self._pidfd = -1
            os.close(pidfd)

"""Worker slots: single-use workers, each in its own sandbox, started ahead of need.

A worker is forked by the zygote into a fresh sandbox (sandbox.py, zygote.py) and
connected by a socketpair. It serves one program; then, whatever happened (completion,
timeout, crash), its sandbox is killed with every process in it and the slot's
successor, started when the program was handed out, takes the next program.
"""
from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from . import fdwait
from . import sandbox as sandbox_paths
from .builtins import MAX_HOLDOUT_SEEDS
from .channel import FDS_PER_MESSAGE, AsyncChannel, FrameTooLarge
from .memcg import RequestCgroup, RequestCgroups
from .reqlog import log_event
from .sandbox import SandboxMode, SandboxPolicy
from .sandboxproc import SandboxProcess
from .scheduler import LeaseScheduler
from .workspace import remove_tree
from .zygote import Zygote

SeedsFn = Callable[[str, int], list[int]]


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: str
    gpu_id: int | None  # None: a CPU worker
    backend: str         # "cpu" | "virtual" | "gpu"
    slot: int = 0        # index among the server's workers (as root: picks the sandbox uid)
    cpus: tuple[int, ...] = ()  # the CPUs its programs run on (empty: any)


@dataclass
class WorkerRun:
    """What the parent learned while a worker ran one program."""

    status: str = "FAILED"
    error: dict[str, Any] | None = None
    returns: list[tuple[str, Any]] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list)
    part_bytes: int = 0  # returned so far, counted against the response limit: binary parts and JSON nodes
    index: int | None = None
    timed_out: bool = False
    crashed: str | None = None  # description when the worker died mid-program
    recycle: bool = False
    lease_wait_ms: float = 0.0
    lease_held_ms: float = 0.0
    too_large: bool = False
    too_large_reason: str | None = None  # why, where not the response's size limit
    bad_blobs: list[str] = field(default_factory=list)
    oom_kills: int = 0  # processes the kernel killed for the request's memory limit


class WorkerHandle:
    """One single-use worker: its sandbox (a bwrap process), its memory cgroup, the
    launcher's status pipe, its channels and its capture files (host-side, outside the
    sandbox)."""

    def __init__(self, spec: WorkerSpec, env: dict[str, str], run_root: str, sandbox: SandboxPolicy,
                 zygote: Zygote, cgroups: RequestCgroups | None = None) -> None:
        self.spec = spec
        self.env = env
        self.run_root = run_root
        self.sandbox = sandbox
        self.zygote = zygote
        self.chan: AsyncChannel | None = None
        self.fd_sock: socket.socket | None = None
        self.box: SandboxProcess | None = None
        self.pid: int | None = None  # the worker's pid (the server's PID namespace)
        self._pid_known = asyncio.Event()
        self.cgroups = cgroups
        self.cgroup: RequestCgroup | None = None
        self.exited: asyncio.Future[int | str] = asyncio.get_running_loop().create_future()
        self._status_task: asyncio.Task[None] | None = None
        self.dir = ""
        self.workdir = ""  # the program's working directory, as the worker sees it
        self.started_at = time.time()
        self.status = "starting"
        self._ended = False

    @property
    def worker_id(self) -> str:
        return self.spec.worker_id

    @property
    def gpu_id(self) -> int | None:
        return self.spec.gpu_id

    @property
    def stdout_path(self) -> str:
        return os.path.join(self.dir, "stdout")

    @property
    def stderr_path(self) -> str:
        return os.path.join(self.dir, "stderr")

    async def start(self, ready_timeout: float = 120.0) -> None:
        self.dir = tempfile.mkdtemp(prefix="w-", dir=self.run_root)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        out_fd = os.open(self.stdout_path, flags, 0o600)
        err_fd = os.open(self.stderr_path, flags, 0o600)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd_parent, fd_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            sandboxed = self.sandbox.mode is SandboxMode.BWRAP
            spec: dict[str, Any] = {
                "worker_id": self.spec.worker_id, "backend": self.spec.backend,
                "verify_blobs": self.sandbox.uid_for(self.spec.slot) is None,
                "limits": {"memory_bytes": 0 if self.spec.backend == "gpu" else self.sandbox.limits.memory_bytes,
                           "processes": self.sandbox.limits.processes, "file_bytes": self.sandbox.limits.file_bytes,
                           "open_files": self.sandbox.limits.open_files},
                "cpus": list(self.spec.cpus),
            }
            if sandboxed:
                uid = self.sandbox.uid_for(self.spec.slot)
                self.box = await SandboxProcess.start(self.sandbox, self.spec.backend == "gpu")
                spec.update(init_pid=self.box.init_pid, userns=self.sandbox.uses_userns,
                            uid=uid, gid=uid, workdir=sandbox_paths.WORK, own_dirs=[*sandbox_paths.WRITABLE_DIRS, "/tmp"],
                            env=self.sandbox.sandbox_env(self.env))
                self.workdir = sandbox_paths.WORK
            else:
                work = os.path.join(self.dir, "work")
                os.mkdir(work, 0o700)
                spec.update(workdir=work, env=self.env)
                self.workdir = work
            self._status_task = asyncio.get_running_loop().create_task(self._read_status(status_r))
            status_r = -1
            await self.zygote.spawn(spec, {"chan": child.fileno(), "fdsock": fd_child.fileno(), "status": status_w,
                                           "stdout": out_fd, "stderr": err_fd})
        finally:
            for fd in (out_fd, err_fd, status_w, status_r):
                if fd >= 0:
                    os.close(fd)
            child.close()
            fd_child.close()
        self.fd_sock = fd_parent
        self.chan = await AsyncChannel.open(parent)
        try:
            msg, _ = await asyncio.wait_for(self.chan.recv(), ready_timeout)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            why = await self._exit_reason(5)
            raise RuntimeError(f"worker {self.worker_id} did not start: {why}") from exc
        if msg.get("t") != "ready":
            raise RuntimeError(f"worker {self.worker_id} sent {msg!r} instead of ready")
        if self.cgroups is not None:
            await self._enter_cgroup(self.cgroups)
        self.started_at = time.time()
        self.status = "idle"

    async def _enter_cgroup(self, cgroups: RequestCgroups) -> None:
        """Move the worker, ready and still without a program, into a memory cgroup of its
        own: whatever the program forks is born inside. The launcher reports the pid
        before the worker can send `ready`, but on another pipe."""
        try:
            await asyncio.wait_for(self._pid_known.wait(), 10)
        except TimeoutError:
            raise RuntimeError(f"worker {self.worker_id}: its pid was never reported") from None
        assert self.pid is not None
        self.cgroup = cgroups.new(f"slot{self.spec.slot}")
        self.cgroup.add(self.pid)

    async def _read_status(self, fd: int) -> None:
        """The launcher's reports: `pid N`, then `exit CODE` or `error MESSAGE`. The pipe is
        read and closed here, never handed to a loop transport (fdwait.py says why)."""
        try:
            os.set_blocking(fd, False)
            async for raw in fdwait.lines(fd):
                line = raw.decode(errors="replace").strip()
                word, _, rest = line.partition(" ")
                if word == "pid" and rest.isdigit():
                    self.pid = int(rest)
                    self._pid_known.set()
                elif word == "exit":
                    self._set_exit(int(rest))
                elif word == "error":
                    self._set_exit(rest)
        finally:
            os.close(fd)
            self._set_exit("the launcher ended without a report")

    def _set_exit(self, value: int | str) -> None:
        if not self.exited.done():
            self.exited.set_result(value)
            # The worker is gone: end its sandbox now, so a daemon it left holding the
            # channel open cannot keep the request waiting.
            self.end()

    async def _exit_reason(self, timeout: float) -> int | str | None:
        try:
            return await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        except TimeoutError:
            return None

    def end(self) -> None:
        """SIGKILL every process of the request, now (idempotent; never blocks)."""
        if self._ended:
            return
        self._ended = True
        self.status = "dead"
        if self.box is not None:
            self.box.kill()
        if self.sandbox.mode is SandboxMode.NONE and self.pid is not None and not self.exited.done():
            # No PID namespace: the worker's session (the launcher sweeps up any orphans
            # once the worker is dead). The worker stays unreaped until the launcher hears
            # of its death, so its group id cannot have been reused.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    async def kill(self) -> int | str | None:
        """End the worker and its sandbox; returns its exit code (or the launcher's error)."""
        self.end()
        if self.chan is not None:
            self.chan.close()
        code = await self._exit_reason(10)
        await self.dispose()
        return code

    async def dispose(self) -> None:
        """Reap bwrap and close what is left (after end())."""
        if self.fd_sock is not None:
            self.fd_sock.close()
            self.fd_sock = None
        if self.box is not None:
            await self.box.wait()
        if self.cgroup is not None:
            await self._remove_cgroup(self.cgroup)

    async def _remove_cgroup(self, cgroup: RequestCgroup) -> None:
        """Once its killed processes have left it (a few milliseconds; without a PID
        namespace, as they exit): retried in a thread, so the loop never waits on it. One
        still busy after 2 s is left to the server's close."""
        self.cgroup = None
        if not await asyncio.to_thread(cgroup.remove, 200):
            log_event("cgroup_not_removed", worker_id=self.worker_id, path=str(cgroup.path))

    def remove_files(self) -> None:
        if self.dir:
            remove_tree(self.dir)

    async def stop(self) -> None:
        await self.kill()
        self.remove_files()

    def send_blob_fds(self, fds: list[int]) -> None:
        """The program's blobs as read-only descriptors, before its job (which lists their digests)."""
        assert self.fd_sock is not None
        for i in range(0, len(fds), FDS_PER_MESSAGE):
            socket.send_fds(self.fd_sock, [b"b"], fds[i:i + FDS_PER_MESSAGE])

    async def run(
        self,
        job: dict[str, Any],
        timeout: float,
        leases: LeaseScheduler | None,
        seeds: SeedsFn,
        max_part_bytes: int,
        blob_fds: Sequence[int] = (),
    ) -> WorkerRun:
        assert self.chan is not None
        res = WorkerRun()
        talk = _Conversation(self.chan, res, self.spec.gpu_id, leases, seeds, max_part_bytes)

        async def converse() -> None:
            self.send_blob_fds(list(blob_fds))
            await talk.until_done(job)

        self.status = "busy"
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for's task of its own keeps
            # an ending exception, this frame and `res` (every part read so far, up to the
            # response limit) in a cycle until the collector runs.
            async with asyncio.timeout(timeout):
                await converse()
        except TimeoutError:
            res.timed_out = True
        except _TooLarge:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            # The worker is alive and said something no worker says: program code wrote on
            # its channel (the kill that follows is ours, not the reason).
            self.end()
            res.crashed = f"the program broke its worker's channel: {type(exc).__name__}: {exc}"
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self.end()
            res.crashed = _describe_exit(await self._exit_reason(5), exc)
        finally:
            self.end()  # single use: whatever happened, every process of the request dies now
            talk.release()
            if self.cgroup is not None:
                res.oom_kills = self.cgroup.oom_kills()
        return res


# Holdout seeds one program may draw in all (each call is at most MAX_HOLDOUT_SEEDS): a
# bench draws a handful; program code writing to its channel could otherwise ask for
# 100k seeds again and again, each batch ~0.4 s of the server's CPU.
MAX_SEEDS_PER_REQUEST = 2 * MAX_HOLDOUT_SEEDS


class _Conversation:
    """One program's messages with its worker, until "done": where it is, what it returns,
    the GPU lease it takes and gives back, the holdout seeds it asks for. What it learns
    goes into `res`; a malformed message raises (the caller counts it a crash)."""

    def __init__(self, chan: AsyncChannel, res: WorkerRun, gpu: int | None, leases: LeaseScheduler | None,
                 seeds: SeedsFn, max_part_bytes: int) -> None:
        self.chan = chan
        self.res = res
        self.gpu = gpu
        self.leases = leases
        self.seeds = seeds
        self.max_part_bytes = max_part_bytes
        self.seeds_drawn = 0
        self._held_since: float | None = None  # while this program holds the lease

    async def until_done(self, job: dict[str, Any]) -> None:
        await self.chan.send(job)
        while True:
            try:
                frame = await self.chan.recv_frame(self.max_part_bytes - self.res.part_bytes)
            except FrameTooLarge as exc:  # refused before its oversized part was read
                self.res.too_large = True
                self.res.too_large_reason = str(exc) or None
                raise _TooLarge() from None
            msg = frame.header
            t = msg.get("t")
            if t == "step":
                self.res.index = int(msg["i"])
            elif t == "return":
                self._returned(msg, frame.bins, frame.counted)
            elif t == "lease":
                await self._lease()
            elif t == "release":
                self.release()
            elif t == "seeds":
                await self._seeds(msg)
            elif t == "done":
                self._done(msg)
                return
            else:
                raise ValueError(f"unexpected worker message {t!r}")
            # A worker writing frames without pause must not keep the loop to itself: with
            # its frames already buffered, the reads above would never yield.
            await asyncio.sleep(0)

    def _returned(self, msg: dict[str, Any], bins: list[bytes], counted: int) -> None:
        # `counted`: the node's JSON as well as its binary parts, so a value returned as a
        # long string (or a forged node) is bounded by the response limit like bytes are.
        self.res.returns.append((str(msg["key"]), msg["node"]))
        self.res.part_bytes += counted  # within the limit: recv_frame refused the frame otherwise
        self.res.parts.extend(bins)

    async def _lease(self) -> None:
        # A CPU worker has nothing to lease; a second request while held is answered at once.
        if self.leases is not None and self.gpu is not None and self._held_since is None:
            t0 = time.monotonic()
            await self.leases.acquire(self.gpu)
            now = time.monotonic()
            self.res.lease_wait_ms += (now - t0) * 1e3
            self._held_since = now
        await self.chan.send({"t": "lease_ok"})

    def release(self) -> None:
        """Give the lease back, if held (idempotent)."""
        if self._held_since is not None:
            self.res.lease_held_ms += (time.monotonic() - self._held_since) * 1e3
            self._held_since = None
            assert self.leases is not None and self.gpu is not None
            self.leases.release(self.gpu)

    async def _seeds(self, msg: dict[str, Any]) -> None:
        # Program code can write to this channel itself, bypassing the builtin's checks:
        # the count is checked here, and so is the program's total.
        namespace, count = msg.get("namespace"), msg.get("count")
        problem = _seeds_problem(namespace, count, self.seeds_drawn)
        if problem is not None:
            await self.chan.send({"t": "seeds_err", "message": problem})
            return
        assert isinstance(namespace, str) and isinstance(count, int)
        self.seeds_drawn += count
        try:
            # HMACs in a thread: 100k of them take ~0.4 s, which the event loop must not wait out.
            values = await asyncio.to_thread(self.seeds, namespace, count)
            await self.chan.send({"t": "seeds_ok", "seeds": values})
        except Exception as exc:  # noqa: BLE001
            await self.chan.send({"t": "seeds_err", "message": str(exc)})

    def _done(self, msg: dict[str, Any]) -> None:
        res = self.res
        res.status = "COMPLETED" if msg.get("status") == "COMPLETED" else "FAILED"
        res.error = msg.get("error")
        res.recycle = bool(msg.get("recycle"))
        bad = msg.get("bad_blobs")
        if isinstance(bad, list):
            res.bad_blobs = [d for d in bad if isinstance(d, str)][:1000]


def _seeds_problem(namespace: Any, count: Any, drawn: int) -> str | None:
    """Why a worker's seeds request is refused, or None."""
    if (not isinstance(namespace, str) or not namespace or isinstance(count, bool)
            or not isinstance(count, int) or not 0 <= count <= MAX_HOLDOUT_SEEDS):
        return ("holdout_seeds: namespace must be a non-empty string and count an integer "
                f"in [0, {MAX_HOLDOUT_SEEDS}]")
    if drawn + count > MAX_SEEDS_PER_REQUEST:
        return (f"holdout_seeds: a program may draw at most {MAX_SEEDS_PER_REQUEST} seeds in all; "
                f"this one already drew {drawn}")
    return None


class _TooLarge(Exception):
    pass


def _describe_exit(code: int | str | None, exc: BaseException) -> str:
    if isinstance(code, str):
        return f"worker process failed: {code}"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process died ({name})"
    if code is not None:
        return f"worker process exited with status {code}"
    return f"worker channel failed: {type(exc).__name__}: {exc}"


@dataclass
class _Slot:
    """One unit of concurrency: its current worker (idle or running a program) and the
    workers started ahead of need to succeed it."""

    spec: WorkerSpec
    current: WorkerHandle | None = None
    ready: collections.deque[WorkerHandle] = field(default_factory=collections.deque)
    spawning: int = 0


# Successors kept started per slot. Two on CPU, so a slot keeps up with back-to-back
# programs while a sandbox takes longer to build than a short program takes to run; one
# on a GPU, where each waiting worker holds a CUDA context.
AHEAD = {"cpu": 2, "virtual": 2, "gpu": 1}


class WorkerPool:
    """Idle workers handed out first come first served. Every worker serves one program;
    its successors are started ahead of need, so one is usually ready when it ends."""

    def __init__(self, specs: list[WorkerSpec], env_for: Callable[[WorkerSpec], dict[str, str]], run_root: str,
                 leases: LeaseScheduler | None, sandbox: SandboxPolicy, zygote: Zygote,
                 cgroups: RequestCgroups | None = None) -> None:
        self.env_for = env_for
        self.cgroups = cgroups
        self.run_root = run_root
        self.leases = leases
        self.sandbox = sandbox
        self.zygote = zygote
        self.slots: dict[str, _Slot] = {s.worker_id: _Slot(s) for s in specs}
        self._idle: list[WorkerHandle] = []
        self._waiters: collections.deque[asyncio.Future[WorkerHandle]] = collections.deque()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closing = False

    @property
    def has_idle(self) -> bool:
        return bool(self._idle)

    @property
    def queue_length(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def start(self) -> None:
        """Start one worker per slot; a failure here stops the server (it would recur)."""
        await self.zygote.ensure()

        async def first(slot: _Slot) -> WorkerHandle:
            w = WorkerHandle(slot.spec, self.env_for(slot.spec), self.run_root, self.sandbox, self.zygote, self.cgroups)
            try:
                await w.start()
            except BaseException:
                await w.stop()
                raise
            return w

        workers = await asyncio.gather(*(first(slot) for slot in self.slots.values()), return_exceptions=True)
        errors = [w for w in workers if isinstance(w, BaseException)]
        if errors:
            for w in workers:
                if isinstance(w, WorkerHandle):
                    await w.stop()
            raise RuntimeError(f"workers could not start: {errors[0]}") from errors[0]
        for slot, w in zip(self.slots.values(), workers, strict=True):
            assert isinstance(w, WorkerHandle)
            slot.current = w
            self._checkin(w)
            self._fill(slot)

    def _background(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _fill(self, slot: _Slot) -> None:
        """Start successors until AHEAD of them are ready or starting."""
        while not self.closing and len(slot.ready) + slot.spawning < AHEAD.get(slot.spec.backend, 1):
            slot.spawning += 1
            self._background(self._spawn(slot))

    async def _spawn(self, slot: _Slot) -> None:
        """Start one worker for the slot (retrying with backoff); it waits in `ready` or,
        if the slot has no current worker, becomes idle at once."""
        delay = 0.5
        try:
            while not self.closing:
                fresh = WorkerHandle(slot.spec, self.env_for(slot.spec), self.run_root, self.sandbox, self.zygote, self.cgroups)
                try:
                    await fresh.start()
                except Exception as exc:  # noqa: BLE001 - keep trying; log why
                    log_event("worker_start_failed", worker_id=slot.spec.worker_id,
                              error=f"{type(exc).__name__}: {exc}")
                    await fresh.stop()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30)
                    continue
                if self.closing:
                    await fresh.stop()
                elif slot.current is None:
                    slot.current = fresh
                    self._checkin(fresh)
                else:
                    slot.ready.append(fresh)
                return
        finally:
            slot.spawning -= 1

    def _pick(self) -> WorkerHandle:
        # Prefer a worker whose GPU has the shortest lease line.
        leases = self.leases
        if leases is not None and len(self._idle) > 1:
            best = min(self._idle, key=lambda w: leases.depth(w.gpu_id) if w.gpu_id is not None else 0)
            self._idle.remove(best)
            return best
        return self._idle.pop(0)

    def _hand_out(self, worker: WorkerHandle) -> WorkerHandle:
        worker.status = "busy"
        self._fill(self.slots[worker.worker_id])
        return worker

    async def checkout(self, timeout: float) -> WorkerHandle:
        if self._idle and not self.queue_length:
            return self._hand_out(self._pick())
        fut: asyncio.Future[WorkerHandle] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            w = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except (TimeoutError, asyncio.CancelledError):
            if fut.done() and not fut.cancelled():
                self._checkin(fut.result())  # handed over just as we gave up
            else:
                fut.cancel()
            raise
        return w

    def _checkin(self, worker: WorkerHandle) -> None:
        worker.status = "idle"
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(self._hand_out(worker))
                return
        self._idle.append(worker)

    def release(self, worker: WorkerHandle) -> None:
        """A worker's program is over: it is disposed of, its successor takes the slot."""
        worker.end()
        self._background(worker.dispose())
        slot = self.slots[worker.worker_id]
        if slot.current is worker:
            slot.current = None
        if slot.ready and not self.closing:
            slot.current = slot.ready.popleft()
            self._checkin(slot.current)
        self._fill(slot)

    async def close(self) -> None:
        self.closing = True
        for t in list(self._tasks):
            t.cancel()
        handles = [h for slot in self.slots.values() for h in (slot.current, *slot.ready) if h is not None] + self._idle
        await asyncio.gather(*(h.stop() for h in set(handles)), return_exceptions=True)
        await self.zygote.close()

    def describe(self) -> list[dict[str, Any]]:
        now = time.time()
        out = []
        for slot in self.slots.values():
            w = slot.current
            status = w.status if w is not None and w.status in ("idle", "busy") else "starting"
            out.append({"worker_id": slot.spec.worker_id, "gpu_id": slot.spec.gpu_id, "status": status,
                        "uptime_seconds": round(now - w.started_at, 3) if w else 0.0,
                        "pid": w.pid if w else None, "cpus": list(slot.spec.cpus) or None})
        return out

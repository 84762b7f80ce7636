"""Worker processes: spawning, running one program on one worker, killing and replacing.

Each worker is `python -m server.worker` in its own session (process group), connected by
a socketpair. A timeout or a crash kills the whole group; the pool then starts a fresh
worker with the same id before that slot takes another program.
"""
from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .builtins import MAX_HOLDOUT_SEEDS
from .channel import AsyncChannel, FrameTooLarge
from .reqlog import log_event
from .scheduler import LeaseScheduler

SeedsFn = Callable[[str, int], list[int]]


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: str
    gpu_id: int | None  # None: a CPU worker
    backend: str         # "cpu" | "virtual" | "gpu"


@dataclass
class WorkerRun:
    """What the parent learned while a worker ran one program."""

    status: str = "FAILED"
    error: dict[str, Any] | None = None
    returns: list[tuple[str, Any]] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list)
    part_bytes: int = 0
    index: int | None = None
    timed_out: bool = False
    crashed: str | None = None  # description when the worker died mid-program
    recycle: bool = False
    lease_wait_ms: float = 0.0
    lease_held_ms: float = 0.0
    too_large: bool = False


class WorkerHandle:
    def __init__(self, spec: WorkerSpec, env: dict[str, str], cwd: str) -> None:
        self.spec = spec
        self.env = env
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.chan: AsyncChannel | None = None
        self.started_at = time.time()
        self.status = "starting"
        self._group_killed = False

    @property
    def worker_id(self) -> str:
        return self.spec.worker_id

    @property
    def gpu_id(self) -> int | None:
        return self.spec.gpu_id

    async def start(self, ready_timeout: float = 120.0) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-u", "-m", "server.worker",
                "--fd", str(child.fileno()), "--worker-id", self.spec.worker_id, "--backend", self.spec.backend,
                pass_fds=(child.fileno(),), start_new_session=True, env=self.env, cwd=self.cwd,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            )
        finally:
            child.close()
        self.chan = await AsyncChannel.open(parent)
        msg, _ = await asyncio.wait_for(self.chan.recv(), ready_timeout)
        if msg.get("t") != "ready":
            raise RuntimeError(f"worker {self.worker_id} sent {msg!r} instead of ready")
        self.started_at = time.time()
        self.status = "idle"

    async def kill(self) -> int | None:
        """SIGKILL the worker's whole process group and reap it; returns its exit status."""
        self.status = "dead"
        if self.chan is not None:
            self.chan.close()
        if self.proc is None:
            return None
        # The group, not just the worker: a program's children outlive a worker that crashed,
        # and asyncio may already have reaped the worker itself (returncode set) by now. The
        # group id stays reserved while any member lives (an empty group raises ESRCH); once
        # only, so a later call cannot reach a new group that reused the number.
        if not self._group_killed:
            self._group_killed = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            return await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            return None

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None and self.chan is not None:
            try:
                await self.chan.send({"t": "exit"})
                await asyncio.wait_for(self.proc.wait(), 2)
            except Exception:  # noqa: BLE001 - fall through to kill
                pass
        await self.kill()

    async def run(
        self,
        job: dict[str, Any],
        timeout: float,
        leases: LeaseScheduler | None,
        seeds: SeedsFn,
        max_part_bytes: int,
    ) -> WorkerRun:
        assert self.chan is not None and self.proc is not None
        res = WorkerRun()
        held_since: list[float] = []  # [t] while this program holds the lease
        chan = self.chan
        gpu = self.spec.gpu_id

        def release() -> None:
            if held_since:
                res.lease_held_ms += (time.monotonic() - held_since.pop()) * 1e3
                assert leases is not None and gpu is not None
                leases.release(gpu)

        async def converse() -> None:
            await chan.send(job)
            while True:
                try:
                    msg, bins = await chan.recv(max_part_bytes - res.part_bytes)
                except FrameTooLarge:  # refused from the header: nothing is buffered
                    res.too_large = True
                    raise _TooLarge() from None
                t = msg.get("t")
                if t == "step":
                    res.index = int(msg["i"])
                elif t == "return":
                    res.returns.append((str(msg["key"]), msg["node"]))
                    res.part_bytes += sum(len(b) for b in bins)
                    if res.part_bytes > max_part_bytes:
                        res.too_large = True
                        raise _TooLarge()
                    res.parts.extend(bins)
                elif t == "lease":
                    if leases is None or gpu is None:
                        await chan.send({"t": "lease_ok"})  # CPU worker: nothing to lease
                        continue
                    if not held_since:
                        t0 = time.monotonic()
                        await leases.acquire(gpu)
                        now = time.monotonic()
                        res.lease_wait_ms += (now - t0) * 1e3
                        held_since.append(now)
                    await chan.send({"t": "lease_ok"})
                elif t == "release":
                    release()
                elif t == "seeds":
                    # Program code can write to this channel itself, bypassing the builtin's
                    # checks: an unbounded count would stall the event loop (and eat memory).
                    namespace, count = msg.get("namespace"), msg.get("count")
                    if (not isinstance(namespace, str) or not namespace or isinstance(count, bool)
                            or not isinstance(count, int) or not 0 <= count <= MAX_HOLDOUT_SEEDS):
                        await chan.send({"t": "seeds_err", "message": "holdout_seeds: namespace must be a "
                                         f"non-empty string and count an integer in [0, {MAX_HOLDOUT_SEEDS}]"})
                        continue
                    try:
                        values = seeds(namespace, count)
                        await chan.send({"t": "seeds_ok", "seeds": values})
                    except Exception as exc:  # noqa: BLE001
                        await chan.send({"t": "seeds_err", "message": str(exc)})
                elif t == "done":
                    res.status = "COMPLETED" if msg.get("status") == "COMPLETED" else "FAILED"
                    res.error = msg.get("error")
                    res.recycle = bool(msg.get("recycle"))
                    return
                else:
                    raise ValueError(f"unexpected worker message {t!r}")

        self.status = "busy"
        try:
            await asyncio.wait_for(converse(), timeout)
        except asyncio.TimeoutError:
            res.timed_out = True
            await self.kill()
        except _TooLarge:
            await self.kill()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError, TypeError) as exc:
            code = await self.kill()
            res.crashed = _describe_exit(code, exc)
        finally:
            release()
        if self.status == "busy":
            self.status = "idle"
        return res


class _TooLarge(Exception):
    pass


def _describe_exit(code: int | None, exc: BaseException) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process died ({name})"
    if code is not None:
        return f"worker process exited with status {code}"
    return f"worker channel failed: {type(exc).__name__}: {exc}"


class WorkerPool:
    """Idle workers handed out first come first served; dead ones replaced in the background."""

    def __init__(self, specs: list[WorkerSpec], env_for: Callable[[WorkerSpec], dict[str, str]], cwd: str,
                 leases: LeaseScheduler | None) -> None:
        self.env_for = env_for
        self.cwd = cwd
        self.leases = leases
        self.workers: dict[str, WorkerHandle] = {s.worker_id: WorkerHandle(s, env_for(s), cwd) for s in specs}
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
        await asyncio.gather(*(w.start() for w in self.workers.values()))
        for w in self.workers.values():
            self._checkin(w)

    def _pick(self) -> WorkerHandle:
        # Prefer a worker whose GPU has the shortest lease line.
        if self.leases is not None and len(self._idle) > 1:
            best = min(self._idle, key=lambda w: self.leases.depth(w.gpu_id) if w.gpu_id is not None else 0)
            self._idle.remove(best)
            return best
        return self._idle.pop(0)

    async def checkout(self, timeout: float) -> WorkerHandle:
        if self._idle and not self.queue_length:
            w = self._pick()
            w.status = "busy"
            return w
        fut: asyncio.Future[WorkerHandle] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            w = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            if fut.done() and not fut.cancelled():
                self._checkin(fut.result())  # handed over just as we gave up
            else:
                fut.cancel()
            raise
        w.status = "busy"
        return w

    def _checkin(self, worker: WorkerHandle) -> None:
        worker.status = "idle"
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                worker.status = "busy"
                fut.set_result(worker)
                return
        self._idle.append(worker)

    def checkin(self, worker: WorkerHandle) -> None:
        """Return a worker after a program; a dead or recycled one is replaced first."""
        if worker.status == "dead" or worker.proc is None or worker.proc.returncode is not None:
            self._spawn_replacement(worker.spec)
        else:
            self._checkin(worker)

    async def retire(self, worker: WorkerHandle) -> None:
        await worker.kill()
        self._spawn_replacement(worker.spec)

    def _spawn_replacement(self, spec: WorkerSpec) -> None:
        if self.closing:
            return
        task = asyncio.get_running_loop().create_task(self._replace(spec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replace(self, spec: WorkerSpec) -> None:
        delay = 0.5
        while not self.closing:
            fresh = WorkerHandle(spec, self.env_for(spec), self.cwd)
            self.workers[spec.worker_id] = fresh
            try:
                await fresh.start()
            except Exception as exc:  # noqa: BLE001 - keep trying; log why
                log_event("worker_start_failed", worker_id=spec.worker_id, error=f"{type(exc).__name__}: {exc}")
                await fresh.kill()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30)
                continue
            log_event("worker_replaced", worker_id=spec.worker_id, pid=fresh.proc.pid if fresh.proc else None)
            self._checkin(fresh)
            return

    async def close(self) -> None:
        self.closing = True
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers.values()), return_exceptions=True)

    def describe(self) -> list[dict[str, Any]]:
        now = time.time()
        return [
            {"worker_id": w.worker_id, "gpu_id": w.gpu_id,
             "status": w.status if w.status in ("idle", "busy") else "starting",  # dead: being replaced
             "uptime_seconds": round(now - w.started_at, 3), "pid": w.proc.pid if w.proc else None}
            for w in self.workers.values()
        ]


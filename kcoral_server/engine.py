"""The request lifecycle: parse, blob cache, idempotency, admission, execution, response.

app.py turns HTTP into calls on `Engine`; everything between the bytes of a request and
the bytes of its answer is here.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import os
import resource
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from kcoral.capabilities import ROUTED_EXTENSIONS_KEY, SERVER_EXTENSIONS
from kcoral.extensions import OptIn, header_value
from kcoral.runners.sandboxed import open_read
from kcoral.errors import WireError
from kcoral.protocol.error_kind import ErrorKind
from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.program import ProgramSpec, UploadTensor
from kcoral.protocol.strict_json import dumps

from .blobs import BlobStore, default_blob_dir, memory_dir
from .cancel import Cancelled, Disconnect, unless_abandoned
from .config import MAX_BLOBS_PER_PROGRAM, ServerConfig
from .gpuinfo import detect_gpus, target_arch, versions
from .holdout import SALT_FILE_NAME, HoldoutSalt
from .joinconfig import NodeStatus
from .journal import Journal, StoredResponse
from .execute_body import ParsedRequest, check_tensor_size, parse_execute_body
from . import cpusets, privs, uidrange
from .memcg import RequestCgroups
from .pool import WorkerHandle, WorkerPool, WorkerRun, WorkerSpec
from .reply import Reply, error_reply
from .reqlog import RequestLog, log_event, log_request
from .sandbox import TRUSTED_CACHE_ENV, SandboxLimits, SandboxMode, SandboxPolicy
from .scheduler import LeaseScheduler
from .tempdirs import make_owned_dir, sweep_stale
from .zygote import Zygote

RUN_DIR_PREFIX = "kcoral-server-"

# Never handed to workers: credentials, anything naming the holdout salt, and the settings
# of an evolve run from the same shell (its database above all).
_SECRET_ENV = ("KCORAL_SERVER_TOKEN", "KCORAL_TOKEN", "KCORAL_NODE_TOKEN")
_SECRET_ENV_PREFIXES = ("EVOLVE_",)


# How long a program whose client disconnected keeps running in case a retry with its
# Idempotency-Key arrives (a dropped connection is usually retried at once, and the retry
# should get this run's answer rather than start over).
RETRY_GRACE_SECONDS = 1.0


# What this server offers beyond the released KCoral protocol is announced in /health
# (kcoral.capabilities.SERVER_EXTENSIONS), so a client uses each only where it is there.


class Engine:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        try:
            # Same-uid processes (programs under --sandbox none) must not read our memory,
            # environment (the token) or file descriptors through /proc.
            privs.set_dumpable(False)
        except OSError:
            pass
        self.instance_id = str(uuid.uuid4())
        self.started_wall = time.time()
        self.started_at = datetime.datetime.now(datetime.UTC).isoformat()
        if config.state_dir:
            os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
        # Request folders on tmpfs when it is roomy: creating them is on every request's path.
        work_parent = config.work_dir or memory_dir(8 << 30)
        sweep_stale(work_parent, RUN_DIR_PREFIX)
        self.run_root = make_owned_dir(RUN_DIR_PREFIX, work_parent)
        self.blobs = BlobStore(default_blob_dir(config.blob_dir, self.run_root), config.blob_cache_bytes)
        self.journal = Journal(config.state_dir, config.journal_retention_seconds, config.journal_max_bytes)
        self.salt = HoldoutSalt.load(config.holdout_salt_file, config.state_dir)
        self.specs, gpu_ids, self.backend = self._plan()
        self.leases = LeaseScheduler(gpu_ids) if gpu_ids else None
        self.gpu_ids = gpu_ids
        self._uid_lock: int | None = None
        self.sandbox = self._sandbox_policy()
        self.cgroups = None if config.request_memory_bytes == 0 else RequestCgroups.open(config.request_memory_bytes, len(self.specs))
        self._base_env = self._worker_env()
        self.pool = WorkerPool(self.specs, self._env_for, self.run_root, self.leases, self.sandbox,
                               Zygote(self._zygote_env(), self.run_root), self.cgroups)
        self.target = target_arch(gpu_ids) if self.backend == "gpu" else {}
        self.versions = versions(self.backend == "gpu")
        self.active = 0
        self.draining = False
        self._jobs: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------ setup
    def _plan(self) -> tuple[list[WorkerSpec], list[int], str]:
        specs, gpus, backend = self._workers()
        shares = cpusets.partition(cpusets.available(), len(specs)) if self.config.pin_cpus else [()] * len(specs)
        return [dataclasses.replace(s, slot=i, cpus=cpus) for i, (s, cpus) in enumerate(zip(specs, shares, strict=True))], gpus, backend

    def _workers(self) -> tuple[list[WorkerSpec], list[int], str]:
        c = self.config
        if c.virtual_gpus:
            gpus, backend = list(range(c.virtual_gpus)), "virtual"
        elif c.cpu_workers:
            return [WorkerSpec(f"cpu/w{i}", None, "cpu") for i in range(c.cpu_workers)], [], "cpu"
        else:
            gpus = c.gpus if c.gpus is not None else detect_gpus()
            backend = "gpu"
            if not gpus:
                n = max(1, min(4, os.cpu_count() or 1))
                return [WorkerSpec(f"cpu/w{i}", None, "cpu") for i in range(n)], [], "cpu"
        return [WorkerSpec(f"gpu{g}/w{k}", g, backend) for g in gpus for k in range(c.workers_per_gpu)], gpus, backend

    def _sandbox_policy(self) -> SandboxPolicy:
        """The sandbox every request runs in; refuses to start unsandboxed unless told to."""
        c = self.config
        limits = SandboxLimits(memory_bytes=c.max_memory_bytes, processes=c.max_processes,
                               file_bytes=c.max_file_bytes, open_files=_open_files(c.max_open_files),
                               workspace_bytes=c.workspace_bytes)
        hidden = [c.state_dir, c.holdout_salt_file, c.token_file, c.node_token_file, c.work_dir, c.blob_dir,
                  self.run_root, self.blobs.directory]
        trusted_cache = None
        if c.trusted_cache:
            trusted_cache = os.path.realpath(c.trusted_cache)
            if not os.path.isdir(trusted_cache):
                raise SystemExit(f"kcoral-server: --trusted-cache {c.trusted_cache}: not a folder")
            if SandboxMode(c.sandbox) is not SandboxMode.BWRAP:
                # Unsandboxed, every program could write it: what is there runs as the baseline.
                raise SystemExit("kcoral-server: --trusted-cache needs the bubblewrap sandbox (it is shown to "
                                 "requests read-only); it cannot be offered with --sandbox none")
        policy = SandboxPolicy(SandboxMode(c.sandbox), limits, hidden=[h for h in hidden if h],
                               trusted_cache=trusted_cache)
        if policy.uid_for(0) is not None:  # as root: a range of uids no other server on this host runs as
            try:
                policy.uid_base, self._uid_lock = uidrange.claim(c.sandbox_uid, len(self.specs))
            except (uidrange.UidRangeTaken, ValueError, OSError) as exc:
                raise SystemExit(f"kcoral-server: {exc}") from None
        if policy.mode is SandboxMode.BWRAP:
            policy.write_identity(self.run_root, len(self.specs))
            why = policy.probe()
            if why is not None:
                log_event("sandbox_unavailable", reason=why)
                raise SystemExit(f"kcoral-server: cannot sandbox requests: {why}. Install bubblewrap and allow "
                                 "user namespaces, or pass --sandbox none to run programs unisolated "
                                 "(as the server's uid, able to reach the server: trusted clients only)")
        else:
            log_event("sandbox_disabled", warning="--sandbox none: programs run as the server's uid and can "
                      "read its state, signal it and outlive their request")
        return policy

    def _worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in _SECRET_ENV and not k.startswith(_SECRET_ENV_PREFIXES) and "HOLDOUT" not in k.upper()}
        # The salt file in every spelling: as given, absolute, links resolved; and the one
        # generated into --state-dir.
        salt_file = self.config.holdout_salt_file or (
            os.path.join(self.config.state_dir, SALT_FILE_NAME) if self.config.state_dir else None)
        if salt_file:
            names = {salt_file, os.path.abspath(salt_file), os.path.realpath(salt_file)}
            env = {k: v for k, v in env.items() if not any(n in v for n in names)}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        # Programs may say how they were isolated (the KDA judge prints it in its report).
        env["KCORAL_SANDBOX"] = self.sandbox.mode.value
        env.pop(TRUSTED_CACHE_ENV, None)  # only --trusted-cache names one (sandbox_env, read-only)
        return env

    def _zygote_env(self) -> dict[str, str]:
        """The zygote imports CuPy and NumPy once for every worker, and some of what they read
        from the environment is read at import (CuPy's kernel cache folder from $HOME and
        $CUPY_CACHE_DIR): so it starts with the environment its sandboxed workers will have."""
        if self.sandbox.mode is SandboxMode.BWRAP:
            return self.sandbox.sandbox_env(self._base_env)
        return self._base_env

    async def start(self) -> None:
        await self.pool.start()
        self._prune_task = asyncio.get_running_loop().create_task(self._prune_loop())
        log_event("server_started", instance_id=self.instance_id, backend=self.backend,
                  workers=len(self.specs), gpus=self.gpu_ids, run_root=self.run_root,
                  sandbox=self._sandbox_described())

    def _sandbox_described(self) -> dict[str, Any]:
        """The sandbox, and the memory cgroup each request gets (None: none)."""
        return {**self.sandbox.describe(), "request_memory": self.cgroups.describe() if self.cgroups else None}

    def _env_for(self, spec: WorkerSpec) -> dict[str, str]:
        """CUDA_VISIBLE_DEVICES is per worker, fixed before the worker imports CuPy."""
        env = dict(self._base_env)
        env["CUDA_VISIBLE_DEVICES"] = str(spec.gpu_id) if spec.backend == "gpu" else ""
        # GPU ids are nvidia-smi's (PCI bus order); CUDA's default order is fastest first,
        # which on a mixed host would make the index name another GPU.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["KCORAL_WORKER_ID"] = spec.worker_id
        return env

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(60)
            self.journal.prune()

    async def close(self) -> None:
        task = getattr(self, "_prune_task", None)
        if task:
            task.cancel()
        await self.pool.close()
        if self.cgroups is not None:
            self.cgroups.close()
        if self._uid_lock is not None:
            os.close(self._uid_lock)
            self._uid_lock = None
        self.blobs.close()
        shutil.rmtree(self.run_root, ignore_errors=True)

    # ------------------------------------------------------------------ health
    def health(self, full: bool) -> dict[str, Any]:
        if not full:
            return {"status": "ok", "instance_id": self.instance_id}
        return {
            "status": "draining" if self.draining else "ok",
            "instance_id": self.instance_id,
            "started_at": self.started_at,
            "uptime_seconds": round(time.time() - self.started_wall, 3),
            "active_requests": self.active,
            "queue_length": self.pool.queue_length,
            "load": {  # the released protocol's view of the same numbers
                "request_capacity": len(self.specs),
                "requests_in_progress": max(0, self.active - self.pool.queue_length),
                "requests_waiting": self.pool.queue_length,
            },
            "gpu_count": len(self.gpu_ids),
            "virtual_gpus": self.backend == "virtual",
            "node_id": self.config.node_id,
            "target": self.target,
            "versions": self.versions,
            "gpus": [{"gpu_id": g,
                      "lease_depth": self.leases.depth(g) if self.leases else 0,
                      "lease_held_s": round(self.leases.held_seconds(g), 3) if self.leases else 0.0}
                     for g in self.gpu_ids],
            "workers": self.pool.describe(),
            "blob_cache": {"blobs": len(self.blobs), "bytes": self.blobs.used_bytes, "capacity": self.blobs.capacity},
            "sandbox": self._sandbox_described(),
            "extensions": list(SERVER_EXTENSIONS),
        }

    def node_status(self) -> NodeStatus:
        """What a router is told about this server (see kcoral_server/gateway/node.py)."""
        return NodeStatus(healthy=not self.draining, server_instance_id=self.instance_id,
                          worker_count=len(self.specs), busy_workers=self.busy_workers(),
                          target={k: str(v) for k, v in self.target.items()},
                          versions={**{k: str(v) for k, v in self.versions.items()},
                                    ROUTED_EXTENSIONS_KEY: ",".join(SERVER_EXTENSIONS)})

    def busy_workers(self) -> int:
        """Workers running a program now (admitted requests not waiting for one)."""
        return max(0, min(len(self.specs), self.active - self.pool.queue_length))

    # ------------------------------------------------------------------ drain
    async def drain(self) -> None:
        """Refuse new programs, then wait for the admitted ones to finish."""
        self.draining = True
        log_event("draining", active_requests=self.active)
        try:
            await asyncio.wait_for(self._idle.wait(), self.config.drain_timeout_seconds)
        except TimeoutError:
            log_event("drain_timeout", active_requests=self.active)

    # ------------------------------------------------------------------ execute
    async def execute(self, body: bytes | memoryview, content_type: str | None, idem_key: str | None, log: RequestLog,
                      opt_ins: frozenset[OptIn] = frozenset(), gone: Disconnect | None = None) -> Reply:
        """Run one program; `gone` is set when the client disconnects, which cancels it."""
        rid = log.request_id
        if self.draining:
            return error_reply(503, ErrorKind.BUSY, "server is draining", rid, retry_after=5)
        if idem_key is not None and (len(idem_key) > 256 or not idem_key.isprintable()):
            return error_reply(400, ErrorKind.PARSE, "Idempotency-Key must be at most 256 printable characters", rid)
        key = None if idem_key is None else _client_key(idem_key)
        self._enter()
        try:
            return await self._execute(body, content_type, key, log, opt_ins, gone)
        except Cancelled:
            return _cancelled(log)
        finally:
            self._leave()

    def _enter(self) -> None:
        self.active += 1
        self._idle.clear()

    def _leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    async def _execute(self, body: bytes | memoryview, content_type: str | None, key: str | None, log: RequestLog,
                       opt_ins: frozenset[OptIn], gone: Disconnect | None) -> Reply:
        admitted = await self._prepare(body, content_type, key, log, opt_ins, gone)
        if isinstance(admitted, Reply):
            return admitted
        return await self._run_admitted(admitted, log, gone=gone)

    async def _prepare(self, body: bytes | memoryview, content_type: str | None, key: str | None,
                       log: RequestLog, opt_ins: frozenset[OptIn],
                       gone: Disconnect | None = None) -> "Reply | _Admitted":
        """Parse, cache blobs, answer replays and CACHE_MISS; else pin blobs and claim the
        key (a journal key: a client's or a job's, under its prefix)."""
        parsed = await self._parse(body, content_type, opt_ins, log.request_id)
        if isinstance(parsed, Reply):
            return parsed
        try:
            await self._store_blobs(parsed)
        finally:
            _release_parts(parsed)
        return await self._admit(parsed, key, log, opt_ins, gone)

    async def _parse(self, body: bytes | memoryview, content_type: str | None, opt_ins: frozenset[OptIn],
                     rid: str) -> "ParsedRequest | Reply":
        """The request as a checked program, or its 400 `parse` (413: too many blobs) answer."""
        try:
            nested = OptIn.NESTED_REFS in opt_ins
            if len(body) > 1 << 20:
                parsed = await asyncio.to_thread(parse_execute_body, body, content_type, nested)
            else:
                parsed = parse_execute_body(body, content_type, nested)
        except WireError as exc:
            return error_reply(400, ErrorKind.PARSE, str(exc), rid)
        gpu_count = parsed.program.options.gpu_count
        if gpu_count is not None and gpu_count > min(1, len(self.gpu_ids)):
            # Each worker leases one GPU; the released server refuses a CPU server's the same way.
            return error_reply(400, ErrorKind.PARSE, f"gpu_count {gpu_count} exceeds this server's capacity "
                               f"of {min(1, len(self.gpu_ids))} GPU per program", rid)
        blobs = len(parsed.program.blob_digests())
        if blobs > MAX_BLOBS_PER_PROGRAM:  # before any is stored or opened
            return error_reply(413, ErrorKind.REQUEST_TOO_LARGE, f"the program uploads {blobs} distinct blobs; "
                               f"this server takes at most {MAX_BLOBS_PER_PROGRAM} per program", rid)
        return parsed

    async def _admit(self, parsed: ParsedRequest, key: str | None, log: RequestLog,
                     opt_ins: frozenset[OptIn], gone: Disconnect | None) -> "Reply | _Admitted":
        """Answer a replay of the key or CACHE_MISS; else pin the blobs and claim the key."""
        rid = log.request_id
        referenced = parsed.program.blob_digests()
        binding = _key_binding(parsed.program_hash, opt_ins)
        while True:
            # From here to journal.begin nothing awaits, so two retries cannot both start.
            if key is not None:
                entry = self.journal.get(key)
                if entry is not None:
                    if entry.program_hash != binding:
                        self.blobs.trim()
                        return error_reply(400, ErrorKind.PARSE, "Idempotency-Key was already used for a different program", rid)
                    entry.wanted.set()  # the first attempt finishes for us even if its client leaves
                    await unless_abandoned(entry.done.wait(), gone)
                    if entry.response is not None:
                        log.fields["replay"] = True
                        self.blobs.trim()
                        return _replayed(entry.response)
                    continue  # the first attempt never ran: try ourselves
            missing = self.blobs.missing(referenced)
            if missing:
                log.fields["status"] = "CACHE_MISS"
                self.blobs.trim()  # nothing pins what this request sent: keep within capacity
                missing = self.blobs.missing(referenced)
                return Reply(200, dumps({"status": "CACHE_MISS", "request_id": rid, "missing_blobs": missing}),
                             headers={"X-Request-ID": rid})
            try:
                self._check_cached_tensors(parsed)
            except WireError as exc:
                self.blobs.trim()
                return error_reply(400, ErrorKind.PARSE, str(exc), rid)
            self.blobs.pin(referenced)
            if key is not None:
                self.journal.begin(key, binding)
            return _Admitted(parsed.program, referenced, key, opt_ins)

    async def _run_admitted(self, adm: "_Admitted", log: RequestLog, keep_busy: bool = False,
                            gone: Disconnect | None = None) -> Reply:
        """Run an admitted program and record its answer under its key (if any).

        `keep_busy` stores a 503 too (a job's poller must learn it was refused); a plain
        request forgets the key instead, so its retry simply runs. So does a cancelled one
        (the client left before any answer): nothing was returned to anyone, so its retry
        runs the program again rather than replaying an answer nobody saw.
        """
        key = adm.key
        try:
            reply = await self._admit_and_run(adm, log, gone)
        except BaseException:
            if key is not None:
                self.journal.abandon(key)
            raise
        finally:
            self.blobs.unpin(adm.referenced)
        if key is not None:
            if reply.status_code == 503 and not keep_busy:
                self.journal.abandon(key)
            else:
                headers = {"Content-Type": reply.content_type, **reply.headers}
                await self.journal.finish(key, StoredResponse(reply.status_code, headers, reply.body))
        return reply

    # ------------------------------------------------------------------ jobs
    async def submit_job(self, body: bytes | memoryview, content_type: str | None, log: RequestLog,
                         opt_ins: frozenset[OptIn] = frozenset()) -> Reply:
        """POST /jobs: admit like /execute, answer 202 with a job id at once, run in the background."""
        rid = log.request_id
        if self.draining:
            return error_reply(503, ErrorKind.BUSY, "server is draining", rid, retry_after=5)
        job_id = uuid.uuid4().hex
        self._enter()
        try:
            admitted = await self._prepare(body, content_type, _job_key(job_id), log, opt_ins)
        except BaseException:
            self._leave()
            raise
        if isinstance(admitted, Reply):
            self._leave()
            return admitted
        task = asyncio.get_running_loop().create_task(self._run_job(admitted, job_id, log.client))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        log.fields.update(status="SUBMITTED", job_id=job_id)
        return Reply(202, dumps({"status": "RUNNING", "job_id": job_id, "request_id": rid}),
                     headers={"Location": f"/jobs/{job_id}"})

    async def _run_job(self, admitted: "_Admitted", job_id: str, client: str) -> None:
        log = RequestLog(str(uuid.uuid4()), client, {"job_id": job_id})
        t0 = time.monotonic()
        try:
            reply = await self._run_admitted(admitted, log, keep_busy=True)
            code = reply.status_code
        except Exception as exc:  # noqa: BLE001 - record the failure for the poller
            code = 500
            self.journal.begin(_job_key(job_id), "")  # the failed run dropped the key
            await self.journal.finish(_job_key(job_id), StoredResponse(500, {"Content-Type": "application/json"},
                                      error_reply(500, ErrorKind.ENGINE, f"{type(exc).__name__}: {exc}", log.request_id).body))
        finally:
            self._leave()
        fields = dict(log.fields)
        fields["status"] = fields.get("status") or ("ERROR" if code != 200 else "OK")
        log_request(request_id=log.request_id, client=client, path="/jobs", http=code,
                    total_ms=round((time.monotonic() - t0) * 1e3, 3), **fields)

    def job_reply(self, job_id: str) -> Reply:
        """GET /jobs/{id}: 202 while it runs, then the stored answer (as /execute gives it)."""
        entry = self.journal.get(_job_key(job_id))
        if entry is None:
            return error_reply(404, ErrorKind.NOT_FOUND, f"no job {job_id!r} (unknown or expired)", "-")
        if entry.response is None:
            return Reply(202, dumps({"status": "RUNNING", "job_id": job_id}))
        return _replayed(entry.response)

    async def _store_blobs(self, parsed: ParsedRequest) -> None:
        for digest, data in parsed.blobs.items():
            if self.blobs.has(digest):
                continue
            replace = self.blobs.is_stale(digest)  # found rewritten: write a new file
            if len(data) > 1 << 20:
                await asyncio.to_thread(self.blobs.write_file, digest, data, replace)
            else:
                self.blobs.write_file(digest, data, replace)
            self.blobs.register(digest, len(data))

    def _check_cached_tensors(self, parsed: ParsedRequest) -> None:
        for i, ins in enumerate(parsed.program.instructions):
            if isinstance(ins, UploadTensor) and ins.blob not in parsed.blobs:
                check_tensor_size(i, ins, self.blobs.size(ins.blob))

    async def _admit_and_run(self, adm: "_Admitted", log: RequestLog, gone: Disconnect | None = None) -> Reply:
        """Wait for a worker and run the program on it, then build the answer. While it
        waits or runs, a disconnected client cancels it (`unless_abandoned`): the worker's
        sandbox is killed and its lease released as at a timeout."""
        ran = await unless_abandoned(self._dispatch(adm, log), gone, self._retry_waits(adm.key))
        if isinstance(ran, Reply):
            return ran
        return await self._answer(adm, log, ran)

    def _retry_waits(self, key: str | None) -> "Callable[[], Awaitable[bool]] | None":
        """For a keyed request: does a retry with the same key wait for this answer (now,
        or within the grace period)? Then the program runs on for it."""
        if key is None:
            return None

        async def waits() -> bool:
            entry = self.journal.get(key)
            if entry is None:
                return False
            try:
                await asyncio.wait_for(entry.wanted.wait(), RETRY_GRACE_SECONDS)
            except TimeoutError:
                return False
            return True

        return waits

    async def _dispatch(self, adm: "_Admitted", log: RequestLog) -> "Reply | _Ran":
        """Check out a worker and run the program on it (503 when none became free)."""
        program, referenced = adm.program, adm.referenced
        rid = log.request_id
        workers = max(1, len(self.specs))
        if self.pool.queue_length >= self.config.max_queue and not self.pool.has_idle:
            return error_reply(503, ErrorKind.BUSY, f"queue is full ({self.pool.queue_length} waiting)", rid,
                               retry_after=max(1, self.pool.queue_length // workers))
        t_queue = time.monotonic()
        try:
            worker = await self.pool.checkout(self.config.queue_timeout_seconds)
        except TimeoutError:
            return error_reply(503, ErrorKind.BUSY, "no worker became free in time", rid,
                               retry_after=max(1, self.pool.queue_length // workers + 1))
        t_dispatch = time.monotonic()
        queue_ms = (t_dispatch - t_queue) * 1e3
        log.fields.update(worker_id=worker.worker_id, gpu=worker.gpu_id, queue_ms=round(queue_ms, 3))
        limit = program.options.output_limit_bytes
        unique = list(dict.fromkeys(referenced))
        job = {
            "t": "exec", "request_id": rid, "workspace": worker.workdir, "output_limit": limit,
            "instructions": [ins.model_dump(by_alias=True) for ins in program.instructions],
            "blobs": unique, "opt_ins": sorted(o.value for o in adm.opt_ins),
        }
        run: WorkerRun | None = None
        fds: list[int] = []
        try:
            # Read-only descriptors of this program's blobs, and nothing else of the cache;
            # one at a time into `fds`, so that a failed open leaves none open.
            for digest in unique:
                fds.append(os.open(self.blobs.path(digest), os.O_RDONLY | os.O_CLOEXEC))
            run = await worker.run(job, program.options.timeout_seconds, self.leases, self.salt.seeds,
                                   self.config.max_response_bytes, fds)
        except asyncio.CancelledError:
            log.fields["elapsed_ms"] = round((time.monotonic() - t_dispatch) * 1e3, 3)
            asyncio.get_running_loop().run_in_executor(None, worker.remove_files)
            raise
        finally:
            for fd in fds:
                os.close(fd)
            self.pool.release(worker)  # ends the worker's sandbox (and so its program) now
        assert run is not None
        return _Ran(worker, run, queue_ms, t_dispatch)

    async def _answer(self, adm: "_Admitted", log: RequestLog, ran: "_Ran") -> Reply:
        """The response for a program that ran (or timed out, or crashed)."""
        program, run, rid = adm.program, ran.run, log.request_id
        for digest in run.bad_blobs:
            if digest in adm.referenced:
                self.blobs.discard(digest)
        output = await _Output.read(ran.worker, program.options.output_limit_bytes)
        asyncio.get_running_loop().run_in_executor(None, ran.worker.remove_files)
        timings = ran.timings()
        log.fields.update(lease_wait_ms=timings["lease_wait_ms"], lease_held_ms=timings["lease_held_ms"])
        common = self._ran_by(ran.worker)
        if run.timed_out:
            log.fields["status"] = "TIMEOUT"
            timings["elapsed_ms"] = ran.elapsed_ms()
            return _timeout_reply(program, run, rid, {**common, **timings}, output)
        if run.too_large:
            log.fields["status"] = "TOO_LARGE"
            why = run.too_large_reason or f"results exceed {self.config.max_response_bytes} bytes"
            return error_reply(500, ErrorKind.RESPONSE_TOO_LARGE, why, rid, **common)
        if run.oom_kills:
            log.fields["oom_kills"] = run.oom_kills
        status, error = _outcome(program, run)
        result = _result_body(program, ran, status, error, rid, {**common, **timings}, output)
        log.fields["status"] = status
        if error:
            log.fields["error_kind"] = error.get("kind")
        result["elapsed_ms"] = ran.elapsed_ms()
        log.fields["elapsed_ms"] = result["elapsed_ms"]
        return _result_reply(result, run.parts, {"X-Request-ID": rid, "X-Instance-ID": self.instance_id})

    def _ran_by(self, worker: WorkerHandle) -> dict[str, Any]:
        """Where the program ran, as every answer about it says."""
        where: dict[str, Any] = {"instance_id": self.instance_id, "worker_id": worker.worker_id, "gpu": worker.gpu_id}
        if self.config.node_id:  # behind a router: which node ran it
            where["node_id"] = self.config.node_id
        return where


@dataclass
class _Ran:
    """A program that went through a worker, before its answer is built."""

    worker: WorkerHandle
    run: WorkerRun
    queue_ms: float
    t_dispatch: float

    def timings(self) -> dict[str, float]:
        """The answer's timings; `elapsed_ms` holds its place there and is measured last."""
        return {"queue_ms": round(self.queue_ms, 3), "elapsed_ms": 0.0,
                "lease_wait_ms": round(self.run.lease_wait_ms, 3), "lease_held_ms": round(self.run.lease_held_ms, 3)}

    def elapsed_ms(self) -> float:
        return round((time.monotonic() - self.t_dispatch) * 1e3, 3)


@dataclass
class _Output:
    """What the program printed, as its answer carries it."""

    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool

    @classmethod
    async def read(cls, worker: WorkerHandle, limit: int) -> "_Output":
        out, out_truncated = await _read_output(worker.stdout_path, limit)
        err, err_truncated = await _read_output(worker.stderr_path, limit)
        return cls(out, err, out_truncated, err_truncated)

    def fields(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _timeout_reply(program: ProgramSpec, run: WorkerRun, rid: str, fields: dict[str, Any], output: _Output) -> Reply:
    where = f" in instruction {run.index} ({_instruction_info(program, run.index)[0]})" if run.index is not None else ""
    return error_reply(504, ErrorKind.TIMEOUT, f"program exceeded its timeout of {program.options.timeout_seconds:g} s{where}",
                       rid, **fields, instruction_index=run.index, **output.fields())


def _outcome(program: ProgramSpec, run: WorkerRun) -> tuple[str, dict[str, Any] | None]:
    """The program's status and error; a crashed worker is a FAILED `runtime` error at the
    instruction it was running."""
    error = run.error
    if run.crashed is not None:
        op, ins_id = _instruction_info(program, run.index)
        error = {"kind": ErrorKind.RUNTIME, "message": run.crashed, "instruction_index": run.index,
                 "instruction_op": op, "instruction_id": ins_id, "traceback": ""}
    if error is not None and run.oom_kills:
        # The program saw only a process killed; say by whom.
        error = {**error, "message": f"{error.get('message', '')} ({run.oom_kills} of the request's processes killed "
                                     f"by the kernel: together they reached the request's memory limit)"}
    return ("FAILED" if run.crashed is not None else run.status), error


def _result_body(program: ProgramSpec, ran: _Ran, status: str, error: dict[str, Any] | None, rid: str,
                 fields: dict[str, Any], output: _Output) -> dict[str, Any]:
    result: dict[str, Any] = {"status": status, "request_id": rid, **fields,
                              "results": {k: node for k, node in ran.run.returns}, **output.fields()}
    if program.options.gpu_count is not None:
        result["gpu_ids"], result["gpu_count"] = [ran.worker.gpu_id], 1  # released: reported together
    if status == "FAILED":
        result["error"] = error or {"kind": ErrorKind.ENGINE, "message": "worker reported failure without details"}
    return result


def _result_reply(result: dict[str, Any], parts: list[bytes], headers: dict[str, str]) -> Reply:
    """The result as JSON, or as multipart with its binary returns."""
    if not parts:
        return Reply(200, dumps(result), headers=headers)
    multipart: list[tuple[str, str, bytes | memoryview]] = [("result", "application/json", dumps(result))]
    multipart += [(f"return:{i}", "application/octet-stream", data) for i, data in enumerate(parts)]
    ctype, chunks = encode_multipart(multipart)
    return Reply(200, b"".join(chunks), ctype, headers)


def _cancelled(log: RequestLog) -> Reply:
    """What a cancelled request answers: nobody reads it (the client is gone); it gives the
    log line its status. 499 is the usual code for "client closed the request"."""
    log.fields["status"] = "CANCELLED"
    return error_reply(499, ErrorKind.CANCELLED, "the client disconnected before the answer; the program was stopped",
                       log.request_id)


def _release_parts(parsed: ParsedRequest) -> None:
    """The blob parts are views of the whole body, and `parsed` lives on while the request
    is admitted: a retry of a running key waits there for the first attempt to end, and
    held its whole body meanwhile. Once stored they are not read again (only their digests)."""
    for view in parsed.blobs.values():
        try:
            view.release()
        except BufferError:  # a write cancelled with its client still reads it: its thread lets go
            pass


def _open_files(requested: int) -> int:
    """RLIMIT_NOFILE for a request's processes: `requested`, or the server's hard limit
    where that is lower (a worker cannot raise it: asking for more would stop every worker
    from starting) or where 0 asks for the server's own. /health shows this value."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return requested
    if requested > hard:
        log_event("open_files_clamped", requested=requested, hard_limit=hard)
    return hard if requested == 0 or requested > hard else requested


@dataclass
class _Admitted:
    """A parsed program whose blobs are present and pinned, ready for a worker."""

    program: ProgramSpec
    referenced: list[str]
    key: str | None
    opt_ins: frozenset[OptIn]


# Journal keys: a client's Idempotency-Key and a job's id each under a prefix of their
# own, so that no key a client chooses names a job's entry (`job:<id>` once did).
def _client_key(idempotency_key: str) -> str:
    return f"key:{idempotency_key}"


def _job_key(job_id: str) -> str:
    return f"job:{job_id}"


def _key_binding(program_hash: str, opt_ins: frozenset[OptIn]) -> str:
    """What an Idempotency-Key is bound to: the program and, since they shape the answer,
    its opt-ins (none: the bare program hash)."""
    if not opt_ins:
        return program_hash
    return hashlib.sha256(f"{program_hash}|{header_value(opt_ins)}".encode()).hexdigest()


def _replayed(r: StoredResponse) -> Reply:
    return Reply(r.status_code, r.body, r.headers.get("Content-Type", "application/json"),
                 {k: v for k, v in r.headers.items() if k != "Content-Type"})


def _instruction_info(program: ProgramSpec, index: int | None) -> tuple[str | None, str | None]:
    if index is None or not 0 <= index < len(program.instructions):
        return None, None
    ins = program.instructions[index]
    return ins.op, getattr(ins, "id", None)


async def _read_output(path: str, limit: int) -> tuple[str, bool]:
    """Captured output; small files (the usual case) are read inline, big ones in a thread."""
    try:
        size = os.lstat(path).st_size  # never through a link the program planted
    except OSError:
        return "", False
    if min(size, limit) <= 1 << 16:
        return _read_capped(path, limit)
    return await asyncio.to_thread(_read_capped, path, limit)


def _read_capped(path: str, limit: int) -> tuple[str, bool]:
    if limit <= 0:
        return "", False
    # The program can replace these files (they sit next to its working directory): a
    # link is not followed and a FIFO or device is not opened for blocking reads.
    try:
        fd = open_read(path)
    except OSError:
        return "", False
    with open(fd, "rb") as f:
        size = os.fstat(fd).st_size
        data = f.read(limit)
    return data.decode("utf-8", "replace"), size > limit

"""`kcoral-server` / `python -m kcoral_server`: flags -> ServerConfig -> uvicorn."""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import resource
import signal
import sys
from typing import Any

import uvicorn
from pydantic import ValidationError
from uvicorn.protocols.http.h11_impl import H11Protocol

from .app import build_app
from .auth import BearerAuth, public_token_problem
from .config import ServerConfig
from .sandbox import TRUSTED_CACHE, TRUSTED_CACHE_ENV, SandboxMode
from .joinconfig import RouterJoin
from .engine import Engine
from . import reqlog
from .reqlog import log_event


def _default(field: str) -> Any:
    """A setting's default, from ServerConfig: the one place it is written."""
    value = ServerConfig.model_fields[field].default
    return value.value if isinstance(value, SandboxMode) else value


def _shown(field: str) -> str:
    """The default as a help text shows it (sizes in GiB)."""
    value = _default(field)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 30 and value % (1 << 30) == 0:
        return f"{value >> 30} GiB"
    return str(value)


def _setting(p: argparse.ArgumentParser | Any, flag: str, field: str, kind: type, text: str, note: str = "") -> None:
    """A flag for a ServerConfig field: its default from there, shown in its help, its value
    stored under the field's name (config_from_args passes it on by that name)."""
    p.add_argument(flag, dest=field, type=kind, default=_default(field), help=f"{text} (default {_shown(field)}{note})")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kcoral-server", description="KCoral benchmark server")
    _setting(p, "--host", "host", str, "address to bind", "; non-loopback needs a token")
    _setting(p, "--port", "port", int, "port", "; 0 picks a free one, logged at start")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gpus", help="comma-separated GPU indices (default: every visible GPU)")
    g.add_argument("--cpu-workers", type=int, help="run N CPU workers and no GPU")
    _setting(g, "--virtual-gpus", "virtual_gpus", int,
             "TEST ONLY: N fake GPUs served by NumPy workers, to exercise leases without hardware")
    _setting(p, "--workers-per-gpu", "workers_per_gpu", int, "workers per GPU")
    p.add_argument("--token-file", help="file holding the bearer token (else $KCORAL_SERVER_TOKEN)")
    p.add_argument("--state-dir", help="folder for the idempotency journal and the generated holdout salt")
    p.add_argument("--holdout-salt-file", help="file holding the holdout salt (else generated)")
    _setting(p, "--max-request-bytes", "max_request_bytes", int, "largest request body")
    _setting(p, "--max-response-bytes", "max_response_bytes", int, "largest result payload")
    _setting(p, "--max-queue", "max_queue", int, "requests that may wait for a worker before 503")
    _setting(p, "--queue-timeout", "queue_timeout_seconds", float, "seconds a request waits for a worker before 503")
    _setting(p, "--max-connections", "max_connections", int,
             "HTTP connections open at once; requests beyond get 503 and further connections are closed")
    _setting(p, "--header-timeout", "header_timeout_seconds", float,
             "seconds a connection has to send a complete request head, from its opening or its last "
             "response; and the longest wait between pieces of a request body (then 408)")
    _setting(p, "--blob-cache-bytes", "blob_cache_bytes", int, "blob cache capacity")
    p.add_argument("--blob-dir", help="parent folder of the blob cache (default: /dev/shm if roomy, else $TMPDIR)")
    p.add_argument("--work-dir", help="parent folder of request workspaces (default: /dev/shm if roomy, else $TMPDIR)")
    _setting(p, "--journal-retention", "journal_retention_seconds", float, "seconds an outcome stays replayable")
    _setting(p, "--journal-max-bytes", "journal_max_bytes", int,
             "bytes of stored outcomes kept for replay; the oldest go first")
    p.add_argument("--sandbox", choices=[m.value for m in SandboxMode], default=_default("sandbox"),
                   help="isolation of each request: a bubblewrap sandbox (default), or none (programs run "
                        "as the server's uid and can reach the server; only for trusted clients)")
    p.add_argument("--sandbox-uid", dest="sandbox_uid", type=int, default=_default("sandbox_uid"),
                   help="as root: worker slot i runs programs as uid/gid SANDBOX_UID+i (default: the first range "
                        "of 1024 uids from 2000000000 that no other kcoral-server on this host holds)")
    _setting(p, "--max-memory-bytes", "max_memory_bytes", int,
             "address space a request may add to its preloaded worker, RLIMIT_AS", "; 0: none; not on GPU workers")
    _setting(p, "--max-processes", "max_processes", int, "processes per request, RLIMIT_NPROC")
    _setting(p, "--max-file-bytes", "max_file_bytes", int, "largest file a request writes")
    _setting(p, "--max-open-files", "max_open_files", int, "descriptors each process of a request may hold, RLIMIT_NOFILE",
             "; 0: the server's own limit, raised to its hard limit for connections")
    _setting(p, "--workspace-bytes", "workspace_bytes", int, "size of a request's tmpfs: its workspace, /tmp and /dev/shm")
    p.add_argument("--request-memory-bytes", dest="request_memory_bytes", type=int, default=_default("request_memory_bytes"),
                   help="memory all of a request's processes may hold together, tmpfs pages included, through a "
                        "memory cgroup per request (default: three quarters of the machine's memory shared "
                        "among the worker slots; 0: no cgroup)")
    p.add_argument("--trusted-cache", metavar="DIR",
                   help="a folder of compile caches that trusted code in requests may read (a bench's "
                        "baseline host starts from its Triton cache instead of compiling fla each time), "
                        f"shown read-only at {TRUSTED_CACHE} and named by ${TRUSTED_CACHE_ENV}; fill it "
                        "on this machine with `kcoral baseline-cache DIR`; needs the bubblewrap sandbox")
    p.add_argument("--no-pin-cpus", dest="pin_cpus", action="store_false", default=_default("pin_cpus"),
                   help="let every request run on every CPU (default: each worker slot's programs run on "
                        "their own share of the server's CPUs, so one request's forks cannot starve the rest)")
    r = p.add_argument_group("joining a router (pip install 'kcoral-evolve[router]')")
    r.add_argument("--router", metavar="URL",
                   help="join this KCoral router (e.g. http://10.0.0.5:9000) as a node: slots are dialled "
                        "out, nothing listens for the router")
    r.add_argument("--node-id", help="this node's stable name at the router (needed with --router)")
    r.add_argument("--node-token-file", help="file holding the router's node token (else $KCORAL_NODE_TOKEN)")
    return p


def join_from_args(args: argparse.Namespace) -> RouterJoin | None:
    """The router to join, or None; a clear exit for half-given or unusable settings."""
    if not args.router:
        if args.node_id or args.node_token_file:
            raise SystemExit("kcoral-server: --node-id and --node-token-file need --router")
        return None
    if not args.node_id:
        raise SystemExit("kcoral-server: --router needs --node-id (this node's stable name)")
    token = None
    if args.node_token_file:
        try:
            with open(args.node_token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise SystemExit(f"kcoral-server: cannot read --node-token-file: {exc}") from None
        if not token:
            raise SystemExit(f"kcoral-server: node token file {args.node_token_file} is empty")
    elif os.environ.get("KCORAL_NODE_TOKEN"):
        token = os.environ["KCORAL_NODE_TOKEN"].strip()
    try:
        import grpc  # noqa: F401
        from .gateway.node import parse_endpoint
    except ImportError as exc:
        raise SystemExit(f"kcoral-server: --router needs grpcio and protobuf ({exc}): "
                         "pip install 'kcoral-evolve[router]'") from None
    try:
        parse_endpoint(args.router)
    except ValueError as exc:
        raise SystemExit(f"kcoral-server: {exc}") from None
    return RouterJoin(router_url=args.router, node_id=args.node_id, token=token)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    token = None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise SystemExit(f"kcoral-server: token file {args.token_file} is empty")
    elif os.environ.get("KCORAL_SERVER_TOKEN"):
        token = os.environ["KCORAL_SERVER_TOKEN"].strip()
    if not _is_loopback(args.host) and (problem := public_token_problem(token)):
        raise SystemExit(f"kcoral-server: {args.host}: {problem}")
    gpus = None
    if args.gpus is not None:
        try:
            gpus = [int(x) for x in args.gpus.split(",") if x.strip()]
        except ValueError:
            raise SystemExit("kcoral-server: --gpus takes comma-separated integers") from None
    # Every flag named for a ServerConfig field is passed on as it is; the rest are read above.
    given = {name: value for name, value in vars(args).items() if name in ServerConfig.model_fields}
    try:
        return ServerConfig(**{**given, "gpus": gpus, "token": token,
                               "node_id": args.node_id if args.router else None})
    except ValidationError as exc:   # a flag's value out of range: say which, not a traceback
        problems = "; ".join(f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
                             for e in exc.errors())
        raise SystemExit(f"kcoral-server: {problems}") from None


class DrainingServer(uvicorn.Server):
    """uvicorn with a graceful SIGTERM: refuse new programs, finish admitted ones, exit 0."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine
        self._drain_requested = False
        self._drain_task: asyncio.Task[None] | None = None  # held: the loop keeps tasks only weakly

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                log_event("listening", url=f"http://{host}:{port}", port=port, instance_id=self.engine.instance_id)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig == signal.SIGTERM and not self._drain_requested and not self.should_exit:
            loop = asyncio.get_event_loop()
            self._drain_requested = True
            loop.call_soon_threadsafe(self._start_drain, loop)
            return
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    def _start_drain(self, loop: asyncio.AbstractEventLoop) -> None:
        self._drain_task = loop.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        node = getattr(getattr(self.config.app, "state", None), "router_node", None)
        if node is not None:   # the router stops sending work here first
            node.begin_shutdown()
        await self.engine.drain()
        self.should_exit = True


def guarded_h11(head_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the limits it lacks: a connection's request head must be
    complete within `head_timeout` seconds of its opening or of its previous response (else
    it is closed: clients trickling partial heads once held 19,900 of 20,000 descriptors),
    and a connection beyond `max_connections` is closed at once, freeing its descriptor
    (uvicorn's limit_concurrency answers 503 only once a request head is complete)."""

    class GuardedH11(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _served: object = None  # the request cycle current when the timer was armed

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._await_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not self._served:  # a new request head arrived
                self._stop_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.cycle.response_complete:
                self._await_head()  # else a pipelined request has already begun

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _await_head(self) -> None:
            self._stop_head_timer()
            self._served = self.cycle
            self._head_timer = self.loop.call_later(head_timeout, self._head_late)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedH11


def raise_fd_limit() -> None:
    """The soft RLIMIT_NOFILE up to the hard one: every connection, worker channel and blob
    descriptor needs one, and a soft limit of 1024 runs out long before --max-connections.
    (A request's processes do not keep it: the zygote sets --max-open-files, soft and hard.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log_event("fd_limit_not_raised", soft=soft, hard=hard, error=str(exc))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    join = join_from_args(args)
    config = config_from_args(args)
    raise_fd_limit()
    engine = Engine(config)
    app = build_app(engine, BearerAuth(config.token.get_secret_value() if config.token else None), join)
    server = DrainingServer(
        uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False,
                       lifespan="on", timeout_keep_alive=30, ws="none", limit_concurrency=config.max_connections,
                       http=guarded_h11(config.header_timeout_seconds, config.max_connections)),
        engine,
    )
    try:
        server.run()
    finally:
        reqlog.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

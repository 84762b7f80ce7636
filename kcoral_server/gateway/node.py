"""Join a released KCoral router (`kcoral-router`, kcoral 0.1.1) as a node.

The router never connects to a node: the node dials out. It holds one `ConnectSupervisor`
stream that reports its health and occupancy every `status_interval_s`, and one
`ConnectSlot` stream per worker; the router hands each slot one HTTP request at a time,
framed (head, data chunks, end), and reads the response back the same way. A request is
served by this server's own ASGI app in-process, so leases, sandbox, journal and request
log are exactly those of a direct request.

Losing the router (or one stream) is survived: every stream reconnects with jittered,
doubling backoff (1 s up to 30 s). A request in flight when its slot breaks cannot deliver
its answer: the app sees `http.disconnect` (its program is cancelled, lease released),
and the node logs `tunnel_lost` with the outcome as unknown. The router answers that
client 502 `server_transport` ("outcome is unknown and was not retried"); nothing here
reruns it.
"""
from __future__ import annotations

import asyncio
import functools
import random
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message

import grpc

from kcoral_server.gateway import kcoral_gateway_pb2 as pb
from kcoral_server.joinconfig import NodeStatus
from kcoral_server.reqlog import log_event

PROTOCOL_VERSION = 1                      # SlotHello.protocol_version the released router accepts
DATA_CHUNK_BYTES = 256 * 1024             # the router refuses larger data frames
GRPC_MESSAGE_BYTES = DATA_CHUNK_BYTES + 64 * 1024
_SLOT_METHOD = "/kcoral.gateway.v1.RouterGateway/ConnectSlot"
_SUPERVISOR_METHOD = "/kcoral.gateway.v1.RouterGateway/ConnectSupervisor"
_BODY_END = object()

# Starlette's own ASGI signature (scope, receive, send), so its app is one without a cast


class Backoff:
    """1 s, 2 s, 4 s ... up to 30 s, each ±20 %; back to 1 s once a stream was accepted."""

    def __init__(self, first_s: float = 1.0, max_s: float = 30.0) -> None:
        self.first_s, self.max_s, self._next = first_s, max_s, first_s

    def reset(self) -> None:
        self._next = self.first_s

    def next(self) -> float:
        wait = self._next * random.uniform(0.8, 1.2)
        self._next = min(self._next * 2, self.max_s)
        return wait


def parse_endpoint(url: str) -> tuple[str, bool]:
    """(host:port, tls) of a router origin such as http://10.0.0.5:9000."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"router URL {url!r} must be an http:// or https:// origin")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"router URL {url!r} must not have a path, query or fragment")
    return parts.netloc, parts.scheme == "https"


class _TunnelRequest:
    """One request on one slot: its body arrives as frames, its response leaves as frames."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.body: asyncio.Queue[Any] = asyncio.Queue()
        self.gone = asyncio.Event()            # the slot broke or the router cancelled
        self.body_ended = False
        self.response_done = False

    async def receive(self) -> Message:
        if not self.body_ended or not self.body.empty():
            getter = asyncio.ensure_future(self.body.get())
            waiter = asyncio.ensure_future(self.gone.wait())
            try:
                await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            if getter.done():
                item = getter.result()
                if item is _BODY_END:
                    return {"type": "http.request", "body": b"", "more_body": False}
                return {"type": "http.request", "body": item, "more_body": True}
            getter.cancel()
            return {"type": "http.disconnect"}
        await self.gone.wait()               # after the body only a disconnect can come
        return {"type": "http.disconnect"}


class RouterNode:
    """The supervisor stream and `slots` slot streams of one server, each reconnecting."""

    def __init__(self, app: ASGIApp, *, router_url: str, node_id: str, token: str | None,
                 slots: int, status: Callable[[], NodeStatus], status_interval_s: float = 1.0) -> None:
        if slots < 1:
            raise ValueError("a node needs at least one slot")
        self.target, self.tls = parse_endpoint(router_url)
        self.router_url = router_url
        self.app = app
        self.node_id = node_id
        self.token = token
        self.slots = slots
        self.status = status
        self.status_interval_s = status_interval_s
        self.supervisor_instance_id = str(uuid.uuid4())
        self.connected_slots = 0
        self._closing = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._active: dict[int, asyncio.Task[None]] = {}

    # ------------------------------------------------------------------ lifecycle
    def _forget(self, index: int, _task: "asyncio.Task[None]") -> None:
        # a finished slot's task leaves the table drain() waits on
        self._active.pop(index, None)

    async def start(self) -> None:
        options = [("grpc.max_send_message_length", GRPC_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES),
                   # A dead router is noticed within ~20 s even with no request in flight.
                   ("grpc.keepalive_time_ms", 15_000), ("grpc.keepalive_timeout_ms", 5_000),
                   ("grpc.keepalive_permit_without_calls", 1)]
        if self.tls:
            self._channel = grpc.aio.secure_channel(self.target, grpc.ssl_channel_credentials(), options=options)
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=options)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._supervise(), name="router-supervisor")]
        self._tasks += [loop.create_task(self._slot_loop(i), name=f"router-slot-{i}") for i in range(self.slots)]
        log_event("router_node_started", router=self.router_url, node_id=self.node_id, slots=self.slots)

    def begin_shutdown(self) -> None:
        """Take no new requests (idle slots close, the node reports unhealthy); requests in
        flight finish and answer."""
        self._closing.set()

    async def close(self, grace_s: float = 30.0) -> None:
        self.begin_shutdown()
        if self._active:
            await asyncio.wait(set(self._active.values()), timeout=grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
        log_event("router_node_stopped", node_id=self.node_id)

    def _log_disconnect(self, exc: BaseException, wait: float, **where: Any) -> None:
        if isinstance(exc, grpc.aio.AioRpcError):
            error = f"{exc.code().name}: {exc.details()}"
        else:
            error = f"{type(exc).__name__}: {exc}"
        fields: dict[str, Any] = dict(where, node_id=self.node_id, error=error[:300], reconnect_in_s=round(wait, 2))
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            # Retried all the same: the router's token may be the one that changes.
            fields["hint"] = ("the router refused this node's token: set KCORAL_NODE_TOKEN or "
                              "--node-token-file to the router's KCORAL_NODE_TOKEN")
        log_event("router_disconnected", **fields)

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("authorization", f"Bearer {self.token}"),) if self.token else None

    # ------------------------------------------------------------------ supervisor
    def _status_message(self) -> pb.SupervisorStatus:
        s = self.status()
        return pb.SupervisorStatus(
            node_id=self.node_id, server_healthy=s.healthy and not self._closing.is_set(),
            supervisor_instance_id=self.supervisor_instance_id, server_instance_id=s.server_instance_id,
            worker_count=s.worker_count, busy_workers=min(s.busy_workers, s.worker_count),
            target={str(k): str(v) for k, v in s.target.items()},
            versions={str(k): str(v) for k, v in s.versions.items()}, health_age_millis=0)

    async def _supervise(self) -> None:
        assert self._channel is not None
        stream = self._channel.stream_stream(_SUPERVISOR_METHOD,
                                             request_serializer=pb.SupervisorStatus.SerializeToString,
                                             response_deserializer=pb.SupervisorAck.FromString)
        backoff = Backoff()
        while True:
            call = stream(metadata=self._metadata(), wait_for_ready=True)
            reader = asyncio.ensure_future(self._drain_acks(call, backoff))
            try:
                while not reader.done():
                    await call.write(self._status_message())
                    # The last status after begin_shutdown says unhealthy: the router stops routing here.
                    await asyncio.wait({reader}, timeout=self.status_interval_s)
                reader.result()
                raise ConnectionError("the router closed the supervisor stream")
            except asyncio.CancelledError:
                call.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - any stream failure: reconnect
                call.cancel()
                reader.cancel()
                wait = backoff.next()
                self._log_disconnect(exc, wait, stream="supervisor")
                await asyncio.sleep(wait)

    async def _drain_acks(self, call: Any, backoff: Backoff) -> None:
        first = True
        async for _ack in call:
            if first:
                first = False
                backoff.reset()
                log_event("router_connected", stream="supervisor", node_id=self.node_id, router=self.router_url)

    # ------------------------------------------------------------------ slots
    async def _slot_loop(self, index: int) -> None:
        backoff = Backoff()
        while not self._closing.is_set():
            accepted = False
            try:
                accepted = await self._slot_once(index, backoff)
                if self._closing.is_set():
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken slot reconnects
                if self._closing.is_set():
                    return
                wait = backoff.next()
                self._log_disconnect(exc, wait, stream="slot", slot=index)
                await asyncio.sleep(wait)
            else:
                if not accepted:
                    await asyncio.sleep(backoff.next())

    async def _slot_once(self, index: int, backoff: Backoff) -> bool:
        """One slot connection, until it breaks or the node shuts down; True if accepted."""
        assert self._channel is not None
        call = self._channel.stream_stream(_SLOT_METHOD, request_serializer=pb.SlotFrame.SerializeToString,
                                           response_deserializer=pb.SlotFrame.FromString)(
            metadata=self._metadata(), wait_for_ready=True)
        current: _TunnelRequest | None = None
        serving: asyncio.Task[None] | None = None
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            status = self.status()
            await call.write(pb.SlotFrame(hello=pb.SlotHello(
                node_id=self.node_id, server_instance_id=status.server_instance_id,
                slot_id=str(uuid.uuid4()), protocol_version=PROTOCOL_VERSION)))
            ack = await call.read()
            if ack is grpc.aio.EOF or ack.WhichOneof("payload") != "ack":
                raise ConnectionError("the router did not acknowledge the slot")
            backoff.reset()
            self.connected_slots += 1
            try:
                while True:
                    reading = asyncio.ensure_future(call.read())
                    while not reading.done():
                        busy = serving is not None and not serving.done()
                        if not busy and closing.done():   # shutting down with this slot idle: close it
                            reading.cancel()
                            return True
                        waits = {reading, serving} if busy else {reading, closing}
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    frame = reading.result()
                    if frame is grpc.aio.EOF:
                        raise ConnectionError("the router closed the slot")
                    kind = frame.WhichOneof("payload")
                    if kind == "request_head":
                        if serving is not None:
                            await serving  # the router reuses a slot only after our end frame
                        # Served even while draining: the app answers 503 busy, which the
                        # client retries elsewhere; dropping it would read as outcome unknown.
                        current = _TunnelRequest(frame.request_id)
                        serving = asyncio.ensure_future(self._serve(call, frame.request_head, current))
                        self._active[index] = serving
                        serving.add_done_callback(functools.partial(self._forget, index))
                    elif kind in ("data", "end", "cancel") and current is not None \
                            and frame.request_id == current.request_id:
                        if kind == "cancel":
                            log_event("tunnel_cancelled", node_id=self.node_id, slot=index,
                                      router_request_id=current.request_id, reason=frame.cancel.reason)
                            current.gone.set()
                            if serving is not None:
                                await asyncio.wait({serving})
                            return True
                        if current.body_ended:
                            raise ConnectionError("the router sent body data after its end")
                        if kind == "end":
                            current.body_ended = True
                            current.body.put_nowait(_BODY_END)
                        else:
                            current.body.put_nowait(bytes(frame.data))
                    else:
                        raise ConnectionError(f"unexpected slot frame {kind!r}")
            finally:
                self.connected_slots -= 1
        except BaseException:
            if current is not None and serving is not None and not serving.done():
                # The slot broke mid-request: the answer cannot reach its client. The app
                # sees a disconnect (program cancelled, lease released); nobody reruns it.
                log_event("tunnel_lost", node_id=self.node_id, slot=index,
                          router_request_id=current.request_id, outcome="unknown",
                          response_sent=current.response_done)
                current.gone.set()
                await asyncio.wait({serving}, timeout=60)
            raise
        finally:
            closing.cancel()
            if serving is not None and not serving.done() and self._closing.is_set():
                await asyncio.wait({serving})     # a draining node finishes and answers
            call.cancel()

    async def _serve(self, call: Any, head: pb.RequestHead, req: _TunnelRequest) -> None:
        started = False

        async def send(message: Message) -> None:
            nonlocal started
            if req.gone.is_set():
                return
            if message["type"] == "http.response.start":
                started = True
                headers = [pb.HttpHeader(name=bytes(n), value=bytes(v)) for n, v in message.get("headers", [])]
                await call.write(pb.SlotFrame(request_id=req.request_id,
                                              response_head=pb.ResponseHead(status=message["status"], headers=headers)))
                return
            if message["type"] != "http.response.body" or not started:
                raise RuntimeError(f"unexpected ASGI message {message['type']!r}")
            body = memoryview(message.get("body", b""))
            for off in range(0, len(body), DATA_CHUNK_BYTES):
                await call.write(pb.SlotFrame(request_id=req.request_id, data=bytes(body[off:off + DATA_CHUNK_BYTES])))
            if not message.get("more_body", False):
                req.response_done = True
                await call.write(pb.SlotFrame(request_id=req.request_id, end=pb.EndOfBody()))

        headers = [(bytes(h.name).lower(), bytes(h.value)) for h in head.headers]
        if not any(n == b"host" for n, _ in headers):
            headers.append((b"host", b"kcoral-router"))
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "2",
            "method": "POST", "scheme": "http", "path": "/execute", "raw_path": b"/execute",
            "query_string": b"", "root_path": "", "headers": headers,
            "client": (f"router:{self.node_id}", 0), "server": ("kcoral-router-node", 0),
            "state": {"router_request_id": req.request_id},
        }
        try:
            await self.app(scope, req.receive, send)
        except grpc.aio.AioRpcError:
            req.gone.set()   # the stream broke while answering: _slot_once logs it

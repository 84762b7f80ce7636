"""`Client`: submits programs to a KCoral server (ours or stock) and decodes outcomes."""
from __future__ import annotations

import os
import threading
import uuid
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay

from . import extensions
from .abort import tracking_transport
from .capabilities import UNKNOWN, ServerCapabilities, is_stock_health
from .compat import adapt_program
from .errors import Cancelled, OutcomeUnknown, RemoteError, TransportError, WireError
from .outcome import Outcome
from .program import Program
from .protocol.error_kind import ErrorKind
from .protocol.multipart import RETURN_PART_RE, encode_multipart, parse_header_params, parse_multipart
from .protocol.strict_json import dumps, loads_strict
from .values import decode_value

INLINE_BLOB_LIMIT = 64 << 10
HTTP_MARGIN_SECONDS = 90.0  # queue wait + serialisation on top of the program's own timeout


class _Busy(Exception):
    def __init__(self, retry_after: float, error: RemoteError) -> None:
        self.retry_after = retry_after
        self.error = error


_RETRYABLE = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ConnectTimeout, _Busy)


class Client:
    """A KCoral server's client. Connection failures and 503 are retried under one
    Idempotency-Key, honouring Retry-After: `retries` attempts per call (1: none, for a
    caller that owns its retries) within `max_retry_seconds`."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        retries: int = 6,
        max_retry_seconds: float = 120.0,
        max_retry_after: float = 30.0,
        inline_blob_limit: int = INLINE_BLOB_LIMIT,
        verify_digests: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("KCORAL_TOKEN") or None
        self.retries = retries
        self.max_retry_seconds = max_retry_seconds
        self.max_retry_after = max_retry_after
        self.inline_blob_limit = inline_blob_limit
        self.verify_digests = verify_digests
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        # Our extensions that change the answers' shapes; a stock server ignores the header.
        headers[extensions.HEADER] = extensions.header_value(set(extensions.OptIn))
        # Its sockets can be shut down from another thread (abort()), which a plain close cannot.
        transport, self._backend = tracking_transport()
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(30.0), transport=transport)
        self._capabilities: ServerCapabilities | None = None
        self._aborted = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._http.close()

    def abort(self) -> None:
        """End every call in flight now, from any thread, and refuse new ones.

        Each connection is shut down, so a call blocked in another thread raises
        `Cancelled` at once and the server sees the disconnect (ours then cancels the
        program). A call interrupted in its own thread (KeyboardInterrupt) needs no
        abort: httpx closes the connection it was reading as the exception passes."""
        self._aborted.set()
        if self._backend is not None:
            self._backend.shutdown_all()
        else:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ retries
    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Busy):
            return min(max(exc.retry_after, 0.05), self.max_retry_after)
        return min(0.2 * (2 ** (state.attempt_number - 1)), 5.0)

    def _with_retries(self, fn: Any, attempts: int | None = None) -> Any:
        retrying = Retrying(
            retry=retry_if_exception_type(_RETRYABLE),
            stop=stop_after_attempt(attempts or self.retries) | stop_after_delay(self.max_retry_seconds),
            wait=self._wait,
            reraise=True,
        )
        def guarded() -> Any:
            if self._aborted.is_set():
                raise Cancelled()
            try:
                return fn()
            except httpx.HTTPError:
                if self._aborted.is_set():  # our own abort(), not a failure to retry
                    raise Cancelled() from None
                raise

        try:
            return retrying(guarded)
        except _Busy as busy:
            raise busy.error from None
        except httpx.TimeoutException as exc:
            raise RemoteError(ErrorKind.TIMEOUT, f"no answer from {self.url}: {exc}") from None
        except httpx.TransportError as exc:
            raise TransportError(f"cannot reach {self.url}: {exc}") from None
        except httpx.HTTPError as exc:  # callers see kcoral's errors only, never httpx's
            raise TransportError(f"bad exchange with {self.url}: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ endpoints
    def health(self, *, retry: bool = True, timeout_s: float | None = None) -> dict[str, Any]:
        """GET /health. `retry=False` makes one attempt (a monitor's poll must not stall the
        caller for the retry policy's minutes while a server restarts)."""
        def once() -> dict[str, Any]:
            if timeout_s is None:
                r = self._http.get(f"{self.url}/health")
            else:
                r = self._http.get(f"{self.url}/health", timeout=timeout_s)
            if r.status_code == 503:
                raise _Busy(_retry_after(r), _error_from(r))
            if r.status_code != 200:
                raise _error_from(r)
            try:
                return r.json()
            except ValueError as exc:
                raise TransportError(f"unreadable /health answer: {exc}", r.headers.get("X-Request-ID")) from None

        return self._with_retries(once, attempts=None if retry else 1)

    def target(self) -> dict[str, Any]:
        return dict(self.health().get("target") or {})

    def capabilities(self) -> ServerCapabilities:
        """What the server offers beyond the released protocol; asked once per client.
        A server that cannot be read is not cached: programs then go out unchanged."""
        if self._capabilities is not None:
            return self._capabilities
        try:
            health = self.health()
        except TransportError:
            return UNKNOWN
        except RemoteError:  # a /health that is not ours nor stock's: change nothing
            self._capabilities = UNKNOWN
            return UNKNOWN
        version = self._stock_version() if is_stock_health(health) else None
        self._capabilities = ServerCapabilities.from_health(health, version)
        return self._capabilities

    def max_timeout(self) -> float:
        """The largest `timeout_seconds` the server honours (it clamps larger ones)."""
        return self.capabilities().max_timeout

    def _stock_version(self) -> str | None:
        # A stock server is a FastAPI app: its version is in the OpenAPI document.
        try:
            r = self._http.get(f"{self.url}/openapi.json", timeout=10.0)
            info = r.json().get("info") or {} if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        version = info.get("version") if isinstance(info, dict) else None
        return version if isinstance(version, str) else None

    def execute(
        self,
        program: Program,
        timeout_seconds: float = 600,
        *,
        output_limit_bytes: int | None = None,
        idempotency_key: str | None = None,
    ) -> Outcome:
        """Run a program; follows the CACHE_MISS protocol and retries transport failures.
        The program is fitted to the server first (`kcoral.compat`): a timeout above the
        server's ceiling is clamped to it, and what the server lacks raises
        `UnsupportedByServer` before anything is sent."""
        caps = self.capabilities()
        timeout_seconds = min(float(timeout_seconds), caps.max_timeout)
        options: dict[str, Any] = {"timeout_seconds": timeout_seconds}
        if output_limit_bytes is not None:
            options["output_limit_bytes"] = output_limit_bytes
        program_json = dumps(adapt_program(program.to_dict(options), caps))
        key = idempotency_key or str(uuid.uuid4())
        http_timeout = httpx.Timeout(30.0, read=float(timeout_seconds) + HTTP_MARGIN_SECONDS)
        first = [d for d, b in program.blobs.items() if len(b) <= self.inline_blob_limit]
        attempts = [first, None, list(program.blobs)]  # None: whatever the server said is missing
        missing: list[str] = []
        for sends in attempts:
            digests = missing if sends is None else sends
            unknown = [d for d in digests if d not in program.blobs]
            if unknown:
                raise RemoteError(ErrorKind.PARSE, f"server asked for blobs this program does not hold: {unknown[:3]}")
            answer = self._send(program_json, {d: program.blobs[d] for d in digests}, key, http_timeout,
                                caps.routed)
            if isinstance(answer, Outcome):
                return answer
            missing = answer
        raise RemoteError(ErrorKind.CACHE_MISS, "server still missed blobs after sending all of them")

    # ------------------------------------------------------------------ internals
    def _send(self, program_json: bytes, blobs: dict[str, Any], key: str, timeout: httpx.Timeout,
              routed: bool = False) -> Outcome | list[str]:
        """One submission (with retries); an Outcome, or the digests the server misses.
        Through a router, a connection that breaks once the request may have gone out is
        an unknown outcome, not a retry: the node that ran it has no journal the next
        node could replay, so sending it again would run it again elsewhere."""
        parts = [("program", "application/json", program_json)]
        parts += [(f"blob:{d}", "application/octet-stream", data) for d, data in blobs.items()]
        ctype, chunks = encode_multipart(parts, part_lengths=False)
        content = b"".join(bytes(c) if isinstance(c, memoryview) else c for c in chunks)
        headers = {"Content-Type": ctype, "Idempotency-Key": key}

        def once() -> httpx.Response:
            try:
                r = self._http.post(f"{self.url}/execute", content=content, headers=headers, timeout=timeout)
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
                if routed and not self._aborted.is_set():
                    raise OutcomeUnknown(f"the connection to the router broke with the program in flight "
                                         f"({type(exc).__name__}: {exc}); its outcome is unknown and it was "
                                         "not sent again") from None
                raise
            if r.status_code == 503:
                raise _Busy(_retry_after(r), _error_from(r))
            return r

        r = self._with_retries(once)
        if r.status_code != 200:
            raise _error_from(r)
        result, parts_by_name = _split_response(r)
        status = result.get("status")
        if status == "CACHE_MISS":
            return [str(d) for d in result.get("missing_blobs", [])]
        if status not in ("COMPLETED", "FAILED"):
            raise TransportError(f"unexpected status {status!r}", result.get("request_id"))
        try:
            results = {k: decode_value(v, parts_by_name, self.verify_digests) for k, v in (result.get("results") or {}).items()}
        except WireError as exc:
            raise TransportError(f"bad result from server: {exc}", result.get("request_id")) from None
        fields = {k: v for k, v in result.items() if k in Outcome.model_fields and k != "results"}
        fields.setdefault("request_id", r.headers.get("X-Request-ID", ""))
        fields["server_instance"] = result.get("instance_id") or r.headers.get("X-Instance-ID")
        return Outcome(results=results, **fields)


def _retry_after(r: httpx.Response) -> float:
    try:
        return float(r.headers.get("Retry-After", "1"))
    except ValueError:
        return 1.0


def _error_from(r: httpx.Response) -> RemoteError:
    kind, message, rid = f"http_{r.status_code}", r.text[:500], r.headers.get("X-Request-ID")
    try:
        body = r.json()
        err = body.get("error") or {}
        kind = err.get("kind", kind)
        message = err.get("message", message)
        rid = body.get("request_id", rid)
    except (ValueError, AttributeError):  # not JSON, or JSON that is not an error object: keep the HTTP text
        pass
    if r.status_code == 502 and kind == ErrorKind.SERVER_TRANSPORT:  # a router lost the node mid-request
        return OutcomeUnknown(message, rid)
    return RemoteError(kind, message, r.status_code, rid)


def _split_response(r: httpx.Response) -> tuple[dict[str, Any], dict[str, memoryview]]:
    ctype = r.headers.get("Content-Type", "")
    main, _ = parse_header_params(ctype)
    try:
        if main == "application/json":
            return loads_strict(r.content), {}
        if main == "multipart/form-data":
            result: dict[str, Any] | None = None
            parts: dict[str, memoryview] = {}
            for part in parse_multipart(r.content, ctype):
                if part.name == "result":
                    result = loads_strict(bytes(part.data))
                elif RETURN_PART_RE.match(part.name):
                    parts[part.name] = part.data
            if result is None:
                raise WireError("multipart response without a 'result' part")
            return result, parts
    except WireError as exc:
        raise TransportError(f"unreadable response: {exc}", r.headers.get("X-Request-ID")) from None
    raise TransportError(f"unexpected response content type {ctype!r}", r.headers.get("X-Request-ID"))

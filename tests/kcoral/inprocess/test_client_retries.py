"""The client's retry policy, against a scripted server: what is retried, how long it
waits, what is never sent twice, and which error each failure becomes."""
from __future__ import annotations

import httpx
import pytest

from kcoral import Cancelled, Program, RemoteError, TransportError
from kcoral.errors import OutcomeUnknown

from .fakeserver import ROUTER_HEALTH, FakeServer, client_for, completed, error


def small_program() -> Program:
    p = Program()
    fn = p.get_function(p.upload("module", source="def main():\n    return 1\n"), "main")
    p.return_("out", p.run(fn))
    return p


def test_busy_is_retried_after_the_servers_retry_after(monkeypatch, no_sleep) -> None:
    server = FakeServer([error(503, "busy", "queue full", **{"Retry-After": "2.5"}),
                         error(503, "busy", "queue full", **{"Retry-After": "2.5"}),
                         completed({"out": {"type": "integer", "value": 1}})])
    with client_for(monkeypatch, server.handle) as client:
        outcome = client.execute(small_program(), timeout_seconds=10)
    assert outcome.status == "COMPLETED" and outcome.results == {"out": 1}
    assert len(server.submissions) == 3
    assert no_sleep == [2.5, 2.5]


def test_retry_after_is_capped_and_floored(monkeypatch, no_sleep) -> None:
    server = FakeServer([error(503, "busy", **{"Retry-After": "600"}), error(503, "busy", **{"Retry-After": "0"}),
                         error(503, "busy", **{"Retry-After": "soon"}), completed()])
    with client_for(monkeypatch, server.handle, max_retry_after=7.0) as client:
        client.execute(small_program(), timeout_seconds=10)
    # Capped at max_retry_after; at least 50 ms; an unreadable header counts as 1 s.
    assert no_sleep == [7.0, 0.05, 1.0]


def test_busy_until_the_attempts_run_out_raises_the_servers_error(monkeypatch, no_sleep) -> None:
    server = FakeServer([error(503, "busy", "queue full", **{"Retry-After": "1"}) for _ in range(3)])
    with client_for(monkeypatch, server.handle, retries=3) as client:
        with pytest.raises(RemoteError) as info:
            client.execute(small_program(), timeout_seconds=10)
    assert (info.value.kind, info.value.status_code, info.value.request_id) == ("busy", 503, "rid-busy")
    assert len(server.submissions) == 3 and len(no_sleep) == 2


def test_every_retry_carries_the_same_idempotency_key(monkeypatch, no_sleep) -> None:
    server = FakeServer([httpx.ConnectError("refused"), error(503, "busy"), httpx.RemoteProtocolError("reset"),
                         completed(), completed()])
    with client_for(monkeypatch, server.handle) as client:
        client.execute(small_program(), timeout_seconds=10)
        client.execute(small_program(), timeout_seconds=10, idempotency_key="mine")
    keys = [s.headers["Idempotency-Key"] for s in server.submissions]
    assert len(keys) == 5
    assert len(set(keys[:4])) == 1, "a retry with a new key would run the program twice"
    assert keys[4] == "mine"


def test_connection_failures_back_off_exponentially(monkeypatch, no_sleep) -> None:
    server = FakeServer([httpx.ConnectError("refused")] * 4 + [completed()])
    with client_for(monkeypatch, server.handle) as client:
        client.execute(small_program(), timeout_seconds=10)
    assert no_sleep == [0.2, 0.4, 0.8, 1.6]


def test_a_server_never_reached_is_a_transport_error(monkeypatch, no_sleep) -> None:
    server = FakeServer([httpx.ConnectError("refused")] * 4)
    with client_for(monkeypatch, server.handle, retries=4) as client:
        with pytest.raises(TransportError) as info:
            client.execute(small_program(), timeout_seconds=10)
    assert info.value.kind == "transport" and "cannot reach http://kcoral.test" in info.value.message
    assert len(server.requests) == 1 + 4  # /health once, then every attempt


def test_a_read_timeout_is_not_retried(monkeypatch, no_sleep) -> None:
    # The program may be running: sending it again would run it twice.
    server = FakeServer([httpx.ReadTimeout("slow")])
    with client_for(monkeypatch, server.handle) as client:
        with pytest.raises(RemoteError) as info:
            client.execute(small_program(), timeout_seconds=10)
    assert info.value.kind == "timeout" and not isinstance(info.value, TransportError)
    assert len(server.submissions) == 1 and no_sleep == []


@pytest.mark.parametrize("status,kind", [(400, "parse"), (401, "unauthorized"), (413, "request_too_large"),
                                         (500, "engine")])
def test_refusals_are_not_retried(monkeypatch, no_sleep, status: int, kind: str) -> None:
    server = FakeServer([error(status, kind, "no")])
    with client_for(monkeypatch, server.handle) as client:
        with pytest.raises(RemoteError) as info:
            client.execute(small_program(), timeout_seconds=10)
    assert (info.value.kind, info.value.status_code, info.value.message) == (kind, status, "no")
    assert len(server.submissions) == 1


def test_an_answer_that_is_not_ours_keeps_its_http_status_as_kind(monkeypatch, no_sleep) -> None:
    server = FakeServer([httpx.Response(418, text="<html>teapot</html>")])
    with client_for(monkeypatch, server.handle) as client:
        with pytest.raises(RemoteError) as info:
            client.execute(small_program(), timeout_seconds=10)
    assert info.value.kind == "http_418" and "teapot" in info.value.message


def test_through_a_router_a_broken_connection_is_an_unknown_outcome(monkeypatch, no_sleep) -> None:
    server = FakeServer([httpx.ReadError("connection reset")], health=dict(ROUTER_HEALTH))
    with client_for(monkeypatch, server.handle) as client:
        assert client.capabilities().routed
        with pytest.raises(OutcomeUnknown):
            client.execute(small_program(), timeout_seconds=10)
    assert len(server.submissions) == 1, "a routed program in flight must not be sent again"


def test_to_our_server_a_broken_connection_is_retried(monkeypatch, no_sleep) -> None:
    # Our server journals keyed programs: the retry gets the first run's answer.
    server = FakeServer([httpx.ReadError("connection reset"), completed()])
    with client_for(monkeypatch, server.handle) as client:
        assert not client.capabilities().routed
        assert client.execute(small_program(), timeout_seconds=10).status == "COMPLETED"
    assert len(server.submissions) == 2


def test_a_router_that_lost_the_node_is_an_unknown_outcome(monkeypatch, no_sleep) -> None:
    server = FakeServer([error(502, "server_transport", "node gone")], health=dict(ROUTER_HEALTH))
    with client_for(monkeypatch, server.handle) as client:
        with pytest.raises(OutcomeUnknown) as info:
            client.execute(small_program(), timeout_seconds=10)
    assert info.value.message == "node gone" and info.value.request_id == "rid-server_transport"


def test_after_abort_nothing_is_sent(monkeypatch, no_sleep) -> None:
    server = FakeServer([completed()])
    with client_for(monkeypatch, server.handle) as client:
        client.health()
        client.abort()
        with pytest.raises(Cancelled):
            client.execute(small_program(), timeout_seconds=10)
    assert [r.url.path for r in server.requests] == ["/health"]


def test_health_without_retry_makes_one_attempt(monkeypatch, no_sleep) -> None:
    calls: list[httpx.Request] = []

    def down(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused")

    with client_for(monkeypatch, down) as client:
        with pytest.raises(TransportError):
            client.health(retry=False)
        assert len(calls) == 1 and no_sleep == []
        with pytest.raises(TransportError):
            client.health()
    assert len(calls) == 1 + client.retries


def test_the_token_and_timeout_go_with_every_request(monkeypatch, no_sleep) -> None:
    server = FakeServer([completed()])
    with client_for(monkeypatch, server.handle) as client:
        client.execute(small_program(), timeout_seconds=42)
    assert all(r.headers["Authorization"] == "Bearer t0ken" for r in server.requests)
    submission = server.submissions[0]
    assert submission.program["options"]["timeout_seconds"] == 42
    # The read timeout leaves room beyond the program's own (queueing, serialisation).
    assert server.requests[-1].extensions["timeout"]["read"] > 42

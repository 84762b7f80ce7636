"""The router pieces that need no router: reading its /health, its lost-node answer, the
node's backoff and endpoint checks. Runtime: well under a second."""
from __future__ import annotations

import httpx
import pytest

from evolve.loop import server_concurrency
from evolve.pipeline.errors import failure_kind, is_transport_error
from evolve.preflight import health_gpus
from kcoral.capabilities import ROUTED_EXTENSIONS_KEY, ServerCapabilities, is_stock_health
from kcoral.client import _error_from
from kcoral.errors import OutcomeUnknown, RemoteError

# /health of the released router (0.1.1) as measured, with GPU nodes of ours behind it.
ROUTER_HEALTH = {"gpu_count": None, "instance_id": "r", "status": "ok", "target": {"arch": "sm_90a"},
                 "load": {"request_capacity": 16, "requests_in_progress": 3, "requests_waiting": 0},
                 "versions": {"python": "3.12.3", ROUTED_EXTENSIONS_KEY: "builtins,max_timeout_3600"}}


def test_router_health_sizes_the_run_and_says_gpus():
    assert server_concurrency(ROUTER_HEALTH) == 16
    assert health_gpus(ROUTER_HEALTH) == 16
    cpu = dict(ROUTER_HEALTH, target={})
    assert health_gpus(cpu) == 0 and server_concurrency(cpu) == 16
    # Our own server's health is read as before: its GPU workers.
    ours = {"gpu_count": 2, "workers": [{"gpu_id": 0}, {"gpu_id": 0}, {"gpu_id": 1}, {"gpu_id": 1}]}
    assert server_concurrency(ours) == 4 and health_gpus(ours) == 2


def test_extensions_of_our_nodes_arrive_through_the_router():
    caps = ServerCapabilities.from_health(ROUTER_HEALTH)
    assert caps.ours and caps.has("builtins") and caps.max_timeout == 3600
    assert not is_stock_health(ROUTER_HEALTH)
    released = dict(ROUTER_HEALTH, versions={"torch": "2.14"})       # a router of released nodes
    assert is_stock_health(released) and not ServerCapabilities.from_health(released).ours


def test_a_lost_node_is_an_unknown_outcome_not_transport_trouble():
    r = httpx.Response(502, json={"error": {"kind": "server_transport", "message":
                                            "KCoral Server tunnel failed; execution outcome is unknown"}})
    err = _error_from(r)
    assert isinstance(err, OutcomeUnknown) and err.kind == "outcome_unknown" and err.status_code == 502
    assert not is_transport_error(err) and failure_kind(err) == "transport"
    other = _error_from(httpx.Response(502, json={"error": {"kind": "bad_gateway", "message": "x"}}))
    assert type(other) is RemoteError and is_transport_error(other)   # a plain 502 is waited out


def test_node_backoff_and_endpoint():
    node = pytest.importorskip("kcoral_server.gateway.node", reason="the [router] extra is not installed")
    b = node.Backoff()
    waits = [b.next() for _ in range(8)]
    assert 0.8 <= waits[0] <= 1.2 and 1.6 <= waits[1] <= 2.4 and all(w <= 36 for w in waits)
    assert waits[-1] >= 24                                    # capped at 30 s, ±20 %
    b.reset()
    assert b.next() <= 1.2
    assert node.parse_endpoint("http://10.0.0.5:9000") == ("10.0.0.5:9000", False)
    assert node.parse_endpoint("https://router.example/") == ("router.example", True)
    for bad in ("grpc://h:1", "http://h:1/path", "http://h:1?q=1", "h:1"):
        with pytest.raises(ValueError):
            node.parse_endpoint(bad)


def test_kcoral_status_names_a_router():
    from kcoral.commands.status import status_line
    line = status_line(ROUTER_HEALTH)
    assert "workers=3/16 busy" in line and "server=router(kcoral-evolve nodes)" in line
    assert "server=router(released nodes)" in status_line(dict(ROUTER_HEALTH, versions={}))


def test_a_router_is_told_apart_from_a_server():
    assert ServerCapabilities.from_health(ROUTER_HEALTH).routed
    stock_server = {"status": "ok", "gpu_count": 0, "load": {"request_capacity": 2}, "target": {}, "versions": {}}
    assert not ServerCapabilities.from_health(stock_server).routed

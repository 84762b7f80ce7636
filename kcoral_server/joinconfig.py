"""How a server joins a router (`--router URL --node-id ID`) and what it reports to it.
Kept apart from ServerConfig, which requests can be told about, because it holds the node
token; and free of grpc, which only kcoral_server/gateway/node.py imports."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RouterJoin:
    router_url: str
    node_id: str
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class NodeStatus:
    """What the supervisor stream reports; the router routes only to a healthy node."""
    healthy: bool
    server_instance_id: str
    worker_count: int
    busy_workers: int
    target: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

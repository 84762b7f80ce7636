"""`kcoral status`: one line of server load (``load=N ...``) or the health JSON."""
from __future__ import annotations

import argparse
import json
from typing import Any

from kcoral.capabilities import routed_extensions

from kcoral.cli import add_remote_options, make_client


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("status", help="server load, queue, GPU leases and workers")
    add_remote_options(p)
    p.add_argument("--json", action="store_true", help="print the server's health JSON")
    p.set_defaults(func=run)


def status_line(health: dict[str, Any]) -> str:
    """``load=N queue=Q gpus=0:d0,1:d1 workers=busy/total ...``; load counts every
    admitted request, waiting ones included."""
    stock = health.get("load")  # a stock server's counters: {requests_in_progress, requests_waiting}
    if isinstance(stock, dict) and "active_requests" not in health:
        load = int(stock.get("requests_in_progress", 0)) + int(stock.get("requests_waiting", 0))
        queue = stock.get("requests_waiting", 0)
    else:
        load = health.get("active_requests", 0)
        queue = health.get("queue_length", 0)
    gpus = health.get("gpus") or []
    leases = ",".join(f"{g.get('gpu_id')}:{g.get('lease_depth', 0)}" for g in gpus) or "none"
    workers = health.get("workers") or []
    busy = sum(1 for w in workers if w.get("status") == "busy")
    total = len(workers)
    if isinstance(stock, dict) and not workers:  # stock: capacity stands for its workers
        busy, total = int(stock.get("requests_in_progress", 0)), int(stock.get("request_capacity", 0))
    parts = [f"load={load}", f"queue={queue}", f"leases={leases}",
             f"workers={busy}/{total} busy"]
    target = health.get("target") or {}
    if target.get("arch"):
        parts.append(f"arch={target['arch']}")
    if health.get("instance_id"):
        parts.append(f"instance={str(health['instance_id'])[:8]}")
    if health.get("uptime_seconds") is not None:
        parts.append(f"uptime={float(health['uptime_seconds']):.0f}s")
    if isinstance(stock, dict) and not isinstance(health.get("extensions"), list):
        # A router reports no GPU count (null) where a server reports a number.
        router = "gpu_count" in health and health["gpu_count"] is None
        ours = routed_extensions(health) is not None
        parts.append(("server=router" + ("(kcoral-evolve nodes)" if ours else "(released nodes)")) if router
                     else "server=stock")  # the released protocol only: no extensions
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        health = client.health()
    print(json.dumps(health, indent=2, sort_keys=True) if args.json else status_line(health))
    return 0

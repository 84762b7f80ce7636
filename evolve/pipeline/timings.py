"""Copy the server's timing facts from an outcome into a stage result's fields."""
from __future__ import annotations

from typing import Any


def outcome_fields(outcome: Any) -> dict[str, Any]:
    """queue_ms, lease_held_ms, and where it ran (server instance, GPU) of a kcoral
    Outcome (absent ones stay None)."""
    if outcome is None:
        return {}
    out: dict[str, Any] = {}
    for name in ("queue_ms", "lease_held_ms"):
        value = getattr(outcome, name, None)
        if isinstance(value, (int, float)):
            out[name] = float(value)
    instance = getattr(outcome, "server_instance", None)
    if isinstance(instance, str) and instance:
        out["server_instance"] = instance
    gpu = getattr(outcome, "gpu", None)
    if isinstance(gpu, int) and not isinstance(gpu, bool):
        out["gpu"] = str(gpu)
    return out


def device_metric(source: Any) -> dict[str, str]:
    """{"device": name} of the card a bench ran on (a BenchReport's device). A speedup is a
    ratio to the baseline on that card (one kernel: 3.14x on an H100, 3.31x on an H200), so
    figures of two kinds of card do not compare."""
    device = getattr(source, "device", None)
    return {"device": device} if isinstance(device, str) and device else {}


def node_metric(source: Any) -> dict[str, str]:
    """{"node": id} when a router node ran it (an Outcome's or a BenchReport's node_id)."""
    node = getattr(source, "node_id", None)
    return {"node": node} if isinstance(node, str) and node else {}


def jsonable(value: Any) -> Any:
    """Plain JSON data from pydantic models, dataclasses, bytes and containers."""
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "__dict__"):
        return jsonable(vars(value))
    return str(value)

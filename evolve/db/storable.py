"""What a stage's result may hold once written, on every backend.

A candidate writes much of what a stage records (its messages, the lines it prints, the
metrics parsed from them), and PostgreSQL refuses two things SQLite takes: a NUL character
in a text column, and NaN or Infinity in a JSON column. A candidate that printed either
failed the row's write, so the row stayed `running` and every `--resume` ran the stage
again (red team, on PostgreSQL). So strings lose their NULs (shown as `\\x00`), non-finite
numbers become null, and metrics too large for a row are cut to their scalar entries.
"""
from __future__ import annotations

import json
import math
from typing import Any

METRICS_MAX_BYTES = 1 << 20  # a stage's metrics as JSON; legitimate ones are a few KiB


def storable(value: Any) -> Any:
    """`value` with every string NUL-free and every non-finite float None (nested)."""
    if isinstance(value, str):
        return value.replace("\x00", "\\x00")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {storable(str(k)): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value


def bounded_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics within METRICS_MAX_BYTES; beyond it, only their scalar entries and a note."""
    size = len(json.dumps(metrics, default=str))
    if size <= METRICS_MAX_BYTES:
        return metrics
    kept = {k: v for k, v in metrics.items() if v is None or isinstance(v, (bool, int, float, str)) and len(str(v)) < 1024}
    return {**kept, "metrics_cut": f"{size} bytes of metrics, over {METRICS_MAX_BYTES}: only the scalar entries kept"}

"""Kernel Tuner cache files (JSON, optionally gzip-compressed) as landscapes.

A brute-forced Kernel Tuner cache holds every configuration of a restricted space with its
mean time in ms, or a failure marker instead of the time. Configurations the tuner
refused before compiling (`InvalidConfig`) lie outside the admitted space and are left out.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from evolve.replay.landscape import Landscape, LandscapeError, Point, _sort_key

FAILURES = {"CompilationFailedConfig": "compile", "RuntimeFailedConfig": "runtime"}
SKIPPED = {"InvalidConfig"}


def read_kernel_tuner_cache(path: Path | str, *, name: str, meta: dict[str, str] | None = None) -> Landscape:
    path = Path(path)
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    try:
        doc = json.loads(raw)
        keys: list[str] = list(doc["tune_params_keys"])
        cache: dict = doc["cache"]
        objective = doc.get("objective", "time")
    except (ValueError, KeyError, TypeError) as exc:
        raise LandscapeError(f"{path}: not a Kernel Tuner cache ({type(exc).__name__}: {exc})") from None
    if objective != "time":
        raise LandscapeError(f"{path}: objective {objective!r}; only time (lower is better) is replayed")
    # Parameters that take one value in the whole cache carry no information: dropped.
    varying = [k for k in keys if len({json.dumps(entry[k]) for entry in cache.values()}) > 1]
    points = []
    for entry in cache.values():
        value = entry["time"]
        if isinstance(value, str) and value in SKIPPED:
            continue
        params = {k: entry[k] for k in varying}
        if isinstance(value, str):
            points.append(Point(params=params, failure=FAILURES.get(value, "runtime")))
        else:
            points.append(Point(params=params, ms=float(value)))
    parameters = {k: sorted({json.dumps(p.params[k]): p.params[k] for p in points}.values(), key=_sort_key)
                  for k in varying}
    info = {"name": name, "device": str(doc.get("device_name") or ""), "kernel": str(doc.get("kernel_name") or "")}
    return Landscape(name=name, meta=info | (meta or {}), parameters=parameters, points=points)

"""A recorded landscape: every point of a space with its time or its failure.

The file is a CSV (optionally gzip-compressed): `# key: value` comment lines first
(source, device, licence, defaults as JSON), then a header of parameter names followed by
`ms` and `failure`, then one row per point. A row has either a time in milliseconds or a
failure kind (compile, runtime, ...), never both. The points recorded are the admitted space:
a replayed strategy can only propose them (the family's constraint is membership).
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import math
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evolve.families import Family, FamilySpec, Value, canonical_params

TIME = "ms"
FAILURE = "failure"


class LandscapeError(ValueError):
    """A landscape file that cannot be used, with the reason."""


class Point(BaseModel):
    params: dict[str, Value]
    ms: float | None = None
    failure: str | None = None


class Landscape(BaseModel):
    name: str
    meta: dict[str, str] = Field(default_factory=dict)
    parameters: dict[str, list[Value]]
    points: list[Point]

    # ---- what replay and scoring need ---------------------------------------------------
    def times(self) -> list[float]:
        return [p.ms for p in self.points if p.ms is not None]

    @property
    def optimum_ms(self) -> float:
        return min(self.times())

    def within(self, fraction: float) -> int:
        """How many points lie within `fraction` of the optimum (0.05: at most 5 % slower)."""
        limit = self.optimum_ms * (1.0 + fraction)
        return sum(1 for t in self.times() if t <= limit)

    def lookup(self) -> dict[tuple, Point]:
        return {canonical_params(p.params): p for p in self.points}

    def defaults(self) -> dict[str, Value]:
        raw = self.meta.get("defaults")
        if raw:
            return json.loads(raw)
        return dict(self.points[0].params)

    def family(self) -> Family:
        return LandscapeFamily(self)


class LandscapeFamily(Family):
    """A family whose admitted points are exactly the recorded ones (no templates: it is
    never rendered, only proposed from)."""

    def __init__(self, landscape: Landscape):
        self._members = [dict(p.params) for p in landscape.points]
        self._keys = {canonical_params(p) for p in self._members}
        spec = FamilySpec(name=landscape.name, workloads=["replay"], parameters=landscape.parameters,
                          defaults=landscape.defaults())
        super().__init__(spec, Path("."))

    def check(self, params: Mapping[str, Any]) -> list[str]:
        errors = self.param_errors(params)
        if errors:
            return errors
        return [] if canonical_params(dict(params)) in self._keys else ["not a recorded point"]

    def _quick_check(self, params: Mapping[str, Any]) -> list[str]:
        return [] if canonical_params(dict(params)) in self._keys else ["not a recorded point"]

    def size_upper_bound(self) -> int:
        return len(self._members)

    def points(self) -> Iterator[dict[str, Value]]:
        defaults = self.defaults
        yield defaults
        for point in self._members:
            if point != defaults:
                yield dict(point)

    def sample(self, rng: random.Random, attempts: int = 200) -> dict[str, Value]:
        return dict(rng.choice(self._members))


# ---- reading and writing ------------------------------------------------------------------
def _value(text: str) -> Value:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _sort_key(v: Value) -> tuple:
    return (0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0.0, str(v))


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def landscape_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".csv"):
        name = name.removesuffix(suffix)
    return name


def load_landscape(path: Path | str) -> Landscape:
    path = Path(path)
    if not path.is_file():
        raise LandscapeError(f"{path}: no such landscape file")
    meta: dict[str, str] = {}
    with _open_text(path) as fh:
        lines: list[str] = []
        for line in fh:
            if line.startswith("#") and not lines:
                key, _, value = line[1:].partition(":")
                meta[key.strip()] = value.strip()
            elif line.strip():
                lines.append(line)
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise LandscapeError(f"{path}: no header row") from None
    if header[-2:] != [TIME, FAILURE] or len(header) < 3:
        raise LandscapeError(f"{path}: the header must be parameter names then {TIME!r} and {FAILURE!r}, "
                             f"not {header}")
    names = header[:-2]
    points: list[Point] = []
    for lineno, row in enumerate(reader, start=2):
        if len(row) != len(header):
            raise LandscapeError(f"{path}: row {lineno} has {len(row)} fields, the header {len(header)}")
        params = {n: _value(v) for n, v in zip(names, row[:-2])}
        ms_text, failure = row[-2].strip(), row[-1].strip()
        if bool(ms_text) == bool(failure):
            raise LandscapeError(f"{path}: row {lineno} needs exactly one of a time and a failure kind")
        ms = float(ms_text) if ms_text else None
        if ms is not None and not (math.isfinite(ms) and ms > 0):
            raise LandscapeError(f"{path}: row {lineno}: time {ms_text!r} is not a positive number")
        points.append(Point(params=params, ms=ms, failure=failure or None))
    if not any(p.ms is not None for p in points):
        raise LandscapeError(f"{path}: no point has a time")
    keys = {canonical_params(p.params) for p in points}
    if len(keys) != len(points):
        raise LandscapeError(f"{path}: a point is recorded twice")
    parameters: dict[str, list[Value]] = {}
    for n in names:
        values = {(type(p.params[n]).__name__, p.params[n]): p.params[n] for p in points}
        parameters[n] = sorted(values.values(), key=_sort_key)
    return Landscape(name=meta.get("name") or landscape_name(path), meta=meta, parameters=parameters,
                     points=points)


def write_landscape(path: Path | str, landscape: Landscape) -> None:
    path = Path(path)
    buf = io.StringIO()
    for key, value in landscape.meta.items():
        buf.write(f"# {key}: {value}\n")
    writer = csv.writer(buf, lineterminator="\n")
    names = list(landscape.parameters)
    writer.writerow(names + [TIME, FAILURE])
    for p in landscape.points:
        writer.writerow([p.params[n] for n in names] + ["" if p.ms is None else f"{p.ms:.6g}", p.failure or ""])
    data = buf.getvalue().encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    else:
        path.write_bytes(data)

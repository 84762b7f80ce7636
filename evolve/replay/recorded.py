"""Our own recorded points: every point of our GPU families measured on a GPU, appended
as it is measured (a CSV: family, params as JSON, ms or failure kind, date, commit, source).

Unlike a brute-forced landscape it need not cover a space; `to_landscape` turns one
family's complete points into a landscape once they do.
"""
from __future__ import annotations

import csv
import json
from datetime import date
from pathlib import Path

from pydantic import BaseModel, model_validator

from evolve.families import Value, canonical_params
from evolve.replay.landscape import Landscape, LandscapeError, Point, _sort_key

COLUMNS = ["family", "params", "ms", "failure", "date", "commit", "source"]


class RecordedPoint(BaseModel):
    family: str
    params: dict[str, Value]
    ms: float | None = None
    failure: str | None = None
    date: date
    commit: str
    source: str = ""

    @model_validator(mode="after")
    def _one_outcome(self) -> RecordedPoint:
        if (self.ms is None) == (self.failure is None):
            raise ValueError("a recorded point needs exactly one of ms and failure")
        if self.ms is not None and not self.ms > 0:
            raise ValueError(f"ms must be positive, not {self.ms}")
        if not self.family or not self.commit:
            raise ValueError("family and commit are required")
        return self


def append_points(path: Path | str, points: list[RecordedPoint]) -> None:
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        if new:
            writer.writerow(COLUMNS)
        for p in points:
            writer.writerow([p.family, json.dumps(p.params, sort_keys=True), "" if p.ms is None else f"{p.ms:.6g}",
                             p.failure or "", p.date.isoformat(), p.commit, p.source])


def load_points(path: Path | str) -> list[RecordedPoint]:
    path = Path(path)
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames != COLUMNS:
            raise LandscapeError(f"{path}: the header must be {','.join(COLUMNS)}, not {reader.fieldnames}")
        out = []
        for lineno, row in enumerate(reader, start=2):
            try:
                out.append(RecordedPoint(family=row["family"], params=json.loads(row["params"]),
                                         ms=float(row["ms"]) if row["ms"] else None, failure=row["failure"] or None,
                                         date=row["date"], commit=row["commit"], source=row["source"]))
            except ValueError as exc:
                raise LandscapeError(f"{path}: row {lineno}: {exc}") from None
        return out


def to_landscape(points: list[RecordedPoint], family: str) -> Landscape:
    """One family's points with every parameter given, the latest record of each point winning."""
    mine = [p for p in points if p.family == family]
    if not mine:
        raise LandscapeError(f"no recorded point of family {family!r}")
    names = set.union(*(set(p.params) for p in mine))
    latest: dict[tuple, RecordedPoint] = {}
    for p in mine:
        if set(p.params) == names:
            latest[canonical_params(p.params)] = p
    if not any(p.ms is not None for p in latest.values()):
        raise LandscapeError(f"family {family!r}: no complete point has a time")
    parameters = {n: sorted({json.dumps(p.params[n]): p.params[n] for p in latest.values()}.values(), key=_sort_key)
                  for n in sorted(names)}
    return Landscape(name=family, meta={"name": family, "source": "recorded points"}, parameters=parameters,
                     points=[Point(params=p.params, ms=p.ms, failure=p.failure) for p in latest.values()])

"""Nsight Compute report readers: the raw CSV page and the key-metric models.

The CSV is what ``ncu --import R --page raw --csv --print-units base --metrics ...``
prints: a header row, a units row (its first cells are empty), then one row per profiled
launch; numbers carry thousands separators ("1,837,824").
"""
from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .errors import NcuError
from .ncu_columns import NAME_COLUMNS, header_row, is_metric_column, profile_fields

# Model field -> ncu metric. The "excessive" column is labelled `byte` by ncu but its value
# is the sector count that the SourceCounters rule text reports.
METRIC_FIELDS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "sectors_excessive": "derived__memory_l2_theoretical_sectors_global_excessive",
    "sectors_total": "memory_l2_theoretical_sectors_global",
    "sectors_ideal": "memory_l2_theoretical_sectors_global_ideal",
    "registers": "launch__registers_per_thread",
    "achieved_occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "shared_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
}
KEY_METRICS: list[str] = list(METRIC_FIELDS.values())
_INT_FIELDS = {"sectors_excessive", "sectors_total", "sectors_ideal", "registers",
               "shared_bank_conflicts"}


class KernelMetrics(BaseModel):
    """One profiled launch. Metrics absent from the report are None."""

    name: str
    launch_id: int | None = None
    duration_ns: float | None = None
    sectors_excessive: int | None = None
    sectors_total: int | None = None
    sectors_ideal: int | None = None
    registers: int | None = None
    achieved_occupancy: float | None = None
    shared_bank_conflicts: int | None = None
    # Where the time goes (None where the report has no such metric: see ncu_columns.py).
    dram_pct: float | None = None     # DRAM throughput, % of peak
    sm_pct: float | None = None       # SM throughput, % of peak
    tensor_pct: float | None = None   # the busiest tensor pipe, % of peak while active
    stalls: dict[str, float] = Field(default_factory=dict)  # top stall reasons: cycles per issued instruction
    # Every metric column of the row (base units), for metrics beyond the key ones.
    values: dict[str, float | None] = Field(default_factory=dict)
    units: dict[str, str] = Field(default_factory=dict)


class NcuMetrics(BaseModel):
    kernels: list[KernelMetrics] = Field(default_factory=list)


def parse_number(text: str) -> float | None:
    """'1,837,824' -> 1837824.0; '' / 'n/a' / '-' -> None."""
    t = text.strip().replace(",", "").replace("\u202f", "").replace(" ", "")
    if t.lower() in ("", "n/a", "na", "-", "nan", "none"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_raw_csv(text: str) -> NcuMetrics:
    """Parse the raw CSV page; tolerant of ``==PROF==``/warning lines before the header."""
    rows = list(csv.reader(io.StringIO(text)))
    header_at = header_row(rows)
    if header_at is None:
        if not text.strip():
            raise NcuError("ncu printed no CSV (was any kernel profiled?)")
        raise NcuError("no header row (with 'ID' and 'Kernel Name') in the ncu CSV")
    header = [c.strip() for c in rows[header_at]]
    body = rows[header_at + 1:]
    units: dict[str, str] = {}
    if body and body[0] and body[0][0].strip() == "":
        units = {h: u.strip() for h, u in zip(header, body[0]) if u.strip()}
        body = body[1:]
    name_col = next(n for n in NAME_COLUMNS if n in header)
    kernels: list[KernelMetrics] = []
    for row in body:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise NcuError(f"ncu CSV row has {len(row)} cells, header has {len(header)}: {row[:3]}")
        cells = dict(zip(header, (c.strip() for c in row)))
        values = {h: parse_number(v) for h, v in cells.items() if is_metric_column(h)}
        fields: dict[str, Any] = {}
        for field_name, metric in METRIC_FIELDS.items():
            v = values.get(metric)
            if v is not None and field_name in _INT_FIELDS:
                v = int(round(v))
            fields[field_name] = v
        fields.update(profile_fields(values))
        launch = parse_number(cells.get("ID", ""))
        kernels.append(KernelMetrics(
            name=cells[name_col], launch_id=None if launch is None else int(launch),
            values=values, units={h: units[h] for h in values if h in units}, **fields))
    return NcuMetrics(kernels=kernels)


def add_profile(metrics: NcuMetrics, profile: NcuMetrics) -> None:
    """Merge the profile page's columns into the key metrics' launches, matched by ID."""
    by_id = {k.launch_id: k for k in profile.kernels if k.launch_id is not None}
    for k in metrics.kernels:
        extra = by_id.get(k.launch_id) if k.launch_id is not None else None
        if extra is None:
            continue
        for name, v in extra.values.items():
            k.values.setdefault(name, v)
        for name, u in extra.units.items():
            k.units.setdefault(name, u)
        for field_name, v in profile_fields(k.values).items():
            setattr(k, field_name, v)


def find_local_ncu() -> str | None:
    return shutil.which("ncu")


def import_report(report: Path, metrics: list[str] | None = None) -> NcuMetrics:
    """Read a saved ``.ncu-rep`` with the local ``ncu`` (which must be installed)."""
    ncu = find_local_ncu()
    if ncu is None:
        raise NcuError(f"reading {report} needs Nsight Compute's `ncu` on PATH; without it, "
                       "use the .ncu-rep.json saved beside the report")
    cmd = [ncu, "--import", str(report), "--page", "raw", "--csv", "--print-units", "base",
           "--metrics", ",".join(metrics or KEY_METRICS)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NcuError(f"ncu --import failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return parse_raw_csv(proc.stdout)


def load_metrics(path: Path) -> NcuMetrics:
    """A report, a saved raw CSV, or a saved metrics JSON, by its suffix."""
    path = Path(path)
    if not path.is_file():
        raise NcuError(f"no such file: {path}")
    if path.suffix == ".json":
        try:
            return NcuMetrics.model_validate(json.loads(path.read_text()))
        except ValueError as exc:
            raise NcuError(f"{path} is not a saved metrics JSON: {exc}") from None
    if path.suffix == ".csv":
        return parse_raw_csv(path.read_text(errors="replace"))
    if path.name.endswith(".ncu-rep"):
        return import_report(path)
    raise NcuError(f"{path}: expected a .ncu-rep, .csv or .json file")


def _fmt(v: float | int | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _top_stall(k: KernelMetrics) -> str:
    if not k.stalls:
        return "-"
    reason, cycles = next(iter(k.stalls.items()))
    return f"{reason[:16]} {cycles:.1f}"


def format_table(metrics: NcuMetrics) -> str:
    """Key metrics, one row per launch."""
    cols = [("id", 4), ("kernel", 28), ("dur us", 10), ("excess sect", 12),
            ("total sect", 12), ("ideal sect", 12), ("regs", 5), ("occ %", 6),
            ("smem confl", 11), ("dram %", 6), ("tc %", 5), ("top stall", 22)]
    lines = ["  ".join(f"{c:>{w}}" if i != 1 else f"{c:<{w}}" for i, (c, w) in enumerate(cols))]
    for k in metrics.kernels:
        name = k.name if len(k.name) <= 28 else k.name[:27] + "…"
        cells = [_fmt(k.launch_id, "d"), name,
                 _fmt(None if k.duration_ns is None else k.duration_ns / 1000.0, ".3f"),
                 _fmt(k.sectors_excessive, ","), _fmt(k.sectors_total, ","),
                 _fmt(k.sectors_ideal, ","), _fmt(k.registers, "d"),
                 _fmt(k.achieved_occupancy, ".1f"), _fmt(k.shared_bank_conflicts, ","),
                 _fmt(k.dram_pct, ".1f"), _fmt(k.tensor_pct, ".1f"), _top_stall(k)]
        lines.append("  ".join(f"{c:>{w}}" if i != 1 else f"{c:<{w}}"
                               for i, (c, (_, w)) in enumerate(zip(cells, cols))))
    if not metrics.kernels:
        lines.append("(no kernel launches in the report)")
    return "\n".join(lines)

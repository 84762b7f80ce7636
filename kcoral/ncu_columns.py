"""The columns of Nsight Compute's raw CSV page that tell where a kernel's time goes.

Standard library only: the tool runner uploaded to a server carries this file (the server
cuts the page down before sending it), and the client's reader (kcoral/ncu.py) uses it too.

These metrics are read wherever a report has them (`--set full` collects them) and never
requested by name: their names differ across ncu versions and chips (Hopper's wgmma has
pipes of its own), and one name this ncu does not know fails the whole capture. So the
server prints the report's whole raw page once more and keeps the columns matched here.
"""
from __future__ import annotations

import csv
import io
import re
from typing import Any

NAME_COLUMNS = ("Kernel Name", "Function Name", "Name")

# ncu 2025.3 on the H200 prints only the first of these in a `--set full` raw page (seen
# 2026-12-05); older versions print the second.
DRAM_PCT = ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed")
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
_TENSOR_CYCLES = re.compile(r"^sm__pipe_tensor\w*_cycles_active\.avg\.pct_of_peak_sustained_active$")
_TENSOR_INSTS = re.compile(r"^sm__inst_executed_pipe_tensor\w*\.avg\.pct_of_peak_sustained_active$")
# Cycles a warp spends stalled for each reason, per issued instruction (Warp State
# Statistics), under either generation's names; the first family found is used.
_STALLS = (re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$"),
           re.compile(r"^smsp__average_warp_latency_issue_stalled_(\w+?)\.ratio$"))
_NOT_STALLS = {"selected"}  # the warp that issued, listed among the reasons
TOP_STALLS = 4


def header_row(rows: list[list[str]]) -> int | None:
    """The index of the page's header (ncu prints `==PROF==` and warning lines before it)."""
    for i, row in enumerate(rows):
        names = [c.strip() for c in row]
        if "ID" in names and any(n in names for n in NAME_COLUMNS):
            return i
    return None


def is_metric_column(name: str) -> bool:
    # ncu metric names are lower-case identifiers (gpu__time_duration.sum,
    # memory_l2_theoretical_sectors_global); the descriptive columns (ID, Kernel Name,
    # Block Size, CC, ...) start with a capital.
    return bool(name) and name[0].islower() and " " not in name


def is_profile_metric(name: str) -> bool:
    return (name in DRAM_PCT or name == SM_PCT or bool(_TENSOR_CYCLES.match(name) or _TENSOR_INSTS.match(name))
            or any(p.match(name) for p in _STALLS))


def profile_fields(values: dict[str, float | None]) -> dict[str, Any]:
    """DRAM and SM throughput, the busiest tensor pipe and the top stall reasons of one
    launch, from its metric columns (None or empty where the report has none)."""
    def busiest(pattern: re.Pattern[str]) -> float | None:
        found = [v for k, v in values.items() if v is not None and pattern.match(k)]
        return max(found) if found else None

    stalls: dict[str, float] = {}
    for pattern in _STALLS:
        for name, v in values.items():
            m = pattern.match(name)
            if m and v is not None and m.group(1) not in _NOT_STALLS:
                stalls[m.group(1)] = v
        if stalls:
            break
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP_STALLS]
    tensor = busiest(_TENSOR_CYCLES)
    dram = next((values[n] for n in DRAM_PCT if values.get(n) is not None), None)
    return {"dram_pct": dram, "sm_pct": values.get(SM_PCT),
            "tensor_pct": tensor if tensor is not None else busiest(_TENSOR_INSTS),
            "stalls": {k: round(v, 3) for k, v in top}}


def profile_columns(text: str) -> str:
    """A raw CSV page cut to its descriptive columns and the profile metrics (`--set full`
    prints over a thousand columns a launch; these are a few dozen)."""
    rows = list(csv.reader(io.StringIO(text)))
    at = header_row(rows)
    if at is None:
        return ""
    header = [c.strip() for c in rows[at]]
    keep = [i for i, h in enumerate(header) if not is_metric_column(h) or is_profile_metric(h)]
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for row in rows[at:]:
        if len(row) == len(header):
            writer.writerow([row[i] for i in keep])
    return out.getvalue()

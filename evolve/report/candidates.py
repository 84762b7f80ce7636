"""One candidate's page in the report: what it is (parameters, sources), where it came
from (its lineage tree), what happened to it (a stage timeline with each attempt's stored
logs) and what the tools measured (NCU metrics per kernel, the IKET stage table)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from evolve.db.records import Candidate, Evaluation, Promotion
from evolve.population import Population
from evolve.vocabulary import EvaluationStatus, Stage

LOG_TAIL_CHARS = 16 * 1024     # per stream in the report; `evolve show ID --logs` has them whole
LINEAGE_DEPTH = 8
NCU_FIELDS = ("duration_ns", "sectors_excessive", "sectors_total", "registers", "achieved_occupancy",
              "shared_bank_conflicts", "dram_pct", "sm_pct", "tensor_pct", "stalls")


@dataclass(frozen=True)
class LogText:
    name: str          # traceback | stdout | stderr
    text: str
    cut: int           # characters left out at the start (0: whole)


@dataclass(frozen=True)
class Attempt:
    """One evaluation, placed on the candidate's timeline (offsets from its first start)."""
    id: int
    stage: str
    attempt: int
    status: str
    failure_kind: str | None
    message: str
    started: datetime
    offset_s: float
    duration_s: float | None
    figures: list[tuple[str, str]]     # (name, value) of what it measured
    logs: list[LogText]
    left_pct: float = 0.0              # the bar on the timeline, in % of the span
    width_pct: float = 0.0


@dataclass(frozen=True)
class LineageNode:
    id: int
    label: str
    how: str                           # operator or origin
    generation: int
    speedup: float | None
    shown: bool                        # has its own page in this report
    repeated: bool = False             # already drawn higher up the tree
    parents: list["LineageNode"] = field(default_factory=list)


@dataclass(frozen=True)
class IketTable:
    trace: str
    span_us: float | None
    rows: list[tuple[str, int, float, float | None]]     # (warp:stage, count, mean µs, period µs)


@dataclass(frozen=True)
class CandidatePage:
    candidate: Candidate
    anchor: str
    speedup: float | None
    params: list[tuple[str, str]]
    promotions: list[Promotion]
    lineage: LineageNode
    children: list[tuple[int, str, bool]]  # (id, label, shown)
    attempts: list[Attempt]
    span_s: float
    ncu: list[dict[str, Any]]             # one row per profiled kernel (latest passed ncu)
    ncu_columns: list[str]
    iket: list[IketTable]


def anchor(candidate_id: int) -> str:
    return f"c{candidate_id}"


def _value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (dict, list, bool)) or v is None else str(v)


def _figures(ev: Evaluation) -> list[tuple[str, str]]:
    out = []
    for name, spec in (("ms", ".4f"), ("baseline_ms", ".4f"), ("speedup", ".3f"), ("spread", ".1%"),
                       ("excessive_sectors", ",d"), ("registers", "d"), ("spills", "d"),
                       ("queue_ms", ".0f"), ("lease_held_ms", ".0f")):
        v = getattr(ev, name)
        if v is not None:
            out.append((name, format(v, spec) + ("x" if name == "speedup" else "")))
    cases = ev.metrics.get("cases")
    if isinstance(cases, list) and cases:
        bad = sum(1 for c in cases if isinstance(c, dict) and c.get("status") != "PASS")
        out.append(("cases", f"{len(cases) - bad} of {len(cases)} pass"))
    return out


def _logs(pop: Population, ev: Evaluation) -> list[LogText]:
    stored = pop.evaluation_logs(ev.id)
    if stored is None:
        return []
    out = []
    for name in ("traceback", "stderr", "stdout"):
        text: str = getattr(stored, name)
        if text.strip():
            cut = max(0, len(text) - LOG_TAIL_CHARS)
            out.append(LogText(name, text[cut:], cut))
    return out


def _lineage(cid: int, by_id: Mapping[int, Candidate], speed: Mapping[int, float | None], shown: set[int],
             seen: set[int], depth: int = 0) -> LineageNode:
    c = by_id[cid]
    node = LineageNode(c.id, c.label, c.operator or c.origin, c.generation, speed.get(c.id), c.id in shown,
                       repeated=cid in seen)
    if cid in seen or depth >= LINEAGE_DEPTH:
        return node
    seen.add(cid)
    node.parents.extend(_lineage(p, by_id, speed, shown, seen, depth + 1) for p in c.parents if p in by_id)
    return node


def _ncu(evaluations: list[Evaluation]) -> tuple[list[dict[str, Any]], list[str]]:
    done = [e for e in evaluations if e.stage == Stage.NCU and e.status == EvaluationStatus.PASSED]
    kernels = done[-1].metrics.get("kernels") if done else None
    if not isinstance(kernels, list):
        return [], []
    rows = [{**k, "stalls": _stalls_text(k.get("stalls"))} for k in kernels if isinstance(k, dict)]
    columns = [f for f in NCU_FIELDS if any(r.get(f) is not None for r in rows)]
    return rows, columns


def _stalls_text(stalls: object) -> str | None:
    """`long_scoreboard 3.2, barrier 1.1`: cycles stalled per issued instruction, top first."""
    if not isinstance(stalls, dict) or not stalls:
        return None
    return ", ".join(f"{reason} {value:.1f}" for reason, value in stalls.items() if isinstance(value, (int, float)))


def _number(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _iket(evaluations: list[Evaluation]) -> list[IketTable]:
    done = [e for e in evaluations if e.stage == Stage.IKET and e.status == EvaluationStatus.PASSED]
    traces = done[-1].metrics.get("traces") if done else None
    if not isinstance(traces, dict):
        return []
    tables = []
    for name, summary in sorted(traces.items()):
        stages = summary.get("stages") if isinstance(summary, dict) else None
        if not isinstance(stages, dict):
            continue
        rows = [(key, int(v.get("count", 0)), float(v.get("mean_us", 0.0)), _number(v.get("period_us")))
                for key, v in stages.items() if isinstance(v, dict)]
        tables.append(IketTable(name, summary.get("span_us"), rows))
    return tables


def candidate_page(pop: Population, cand: Candidate, *, by_id: Mapping[int, Candidate],
                   speed: Mapping[int, float | None], shown: set[int], promotions: list[Promotion]) -> CandidatePage:
    evaluations = sorted(pop.evaluations(cand.id), key=lambda e: (e.started_at, e.id))
    start = evaluations[0].started_at if evaluations else cand.created_at
    ends = [(e.ended_at or e.started_at) for e in evaluations]
    span = max(((end - start).total_seconds() for end in ends), default=0.0) or 1.0
    attempts = []
    for ev in evaluations:
        offset = (ev.started_at - start).total_seconds()
        dur = ev.duration_s
        attempts.append(Attempt(
            id=ev.id, stage=ev.stage, attempt=ev.attempt, status=ev.status, failure_kind=ev.failure_kind,
            message=ev.message, started=ev.started_at, offset_s=offset, duration_s=dur,
            figures=_figures(ev), logs=_logs(pop, ev),
            left_pct=round(100 * offset / span, 2), width_pct=round(max(0.5, 100 * (dur or 0.0) / span), 2)))
    ncu_rows, ncu_columns = _ncu(evaluations)
    return CandidatePage(
        candidate=cand, anchor=anchor(cand.id), speedup=speed.get(cand.id),
        params=[(k, _value(v)) for k, v in sorted(cand.params.items())],
        promotions=[p for p in promotions if p.candidate_id == cand.id],
        lineage=_lineage(cand.id, by_id, speed, shown, set()),
        children=[(c.id, c.label, c.id in shown) for c in by_id.values() if cand.id in c.parents],
        attempts=attempts, span_s=span, ncu=ncu_rows, ncu_columns=ncu_columns, iket=_iket(evaluations))

"""`evolve show ID`: one candidate's stages, attempts, metrics, lineage and logs."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from evolve.db import DB_HELP, SchemaVersionError
from evolve.population import Candidate, Evaluation, Population
from evolve.safe_text import safe_text

# Metrics entries shown as log text rather than as values.
LOG_SUFFIXES = ("stdout", "stderr", "log", "_tail", "traceback")


def find_candidate(pop: Population, key: str) -> Candidate | None:
    """By id, else by directory as stored, relative to the working directory, or absolute."""
    if key.isdigit():
        found = pop.candidate(int(key))
        if found is not None:
            return found
    path = Path(key)
    tries = [key, path.as_posix().rstrip("/"), path.resolve().as_posix()]
    try:
        tries.append(path.resolve().relative_to(Path.cwd().resolve()).as_posix())
    except ValueError:
        pass
    for candidate_path in dict.fromkeys(tries):
        found = pop.candidate_by_directory(candidate_path)
        if found is not None:
            return found
    return None


def _is_log(key: str, value: Any) -> bool:
    return isinstance(value, str) and key.lower().endswith(LOG_SUFFIXES)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}ms"


def _cases_summary(cases: list) -> str:
    """`16 PASS` or `15 PASS, 1 FAIL: probe_T65 (detail)`; the full list is in --json."""
    statuses: dict[str, int] = {}
    bad: list[str] = []
    for case in cases:
        status = str(case.get("status", "?")) if isinstance(case, dict) else "?"
        statuses[status] = statuses.get(status, 0) + 1
        if status != "PASS" and isinstance(case, dict):
            bad.append(f"{case.get('name')} ({case.get('detail', '')})")
    text = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    return text + (": " + "; ".join(bad) if bad else "")


def _evaluation_lines(ev: Evaluation) -> list[str]:
    took = "-" if ev.duration_s is None else f"{ev.duration_s:.1f}s"
    head = f"  #{ev.id} {ev.stage} attempt {ev.attempt}: {ev.status}"
    if ev.failure_kind:
        head += f" ({ev.failure_kind})"
    head += f"  took {took}, queue {_ms(ev.queue_ms)}, lease {_ms(ev.lease_held_ms)}"
    if ev.retry_of is not None:
        head += f", retry of #{ev.retry_of}"
    if ev.server_instance or ev.gpu is not None:
        where = f"gpu {ev.gpu}" if ev.gpu is not None else "no gpu"
        head += f", on {(ev.server_instance or '?')[:8]} {where}"
    lines = [head, f"     started {ev.started_at:%Y-%m-%d %H:%M:%S}Z" + (f" run {ev.run_id}" if ev.run_id else "")]
    numbers = {
        k: getattr(ev, k)
        for k in ("ms", "baseline_ms", "speedup", "spread", "excessive_sectors", "registers", "spills")
        if getattr(ev, k) is not None
    }
    if numbers:
        lines.append("     " + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items()))
    if ev.message:
        lines.extend("     | " + line for line in ev.message.splitlines()[-20:])
    values = {k: v for k, v in ev.metrics.items() if not _is_log(k, v)}
    if isinstance(values.get("cases"), list):
        lines.append("     cases: " + _cases_summary(values.pop("cases")))
    if values:
        lines.append("     metrics: " + json.dumps(values, sort_keys=True, default=str))
    for key, text in ev.metrics.items():
        if _is_log(key, text) and text.strip():
            lines.append(f"     {key}:")
            lines.extend("       " + line for line in text.splitlines()[-30:])
    return lines


def _log_lines(pop: Population, ev: Evaluation) -> list[str]:
    logs = pop.evaluation_logs(ev.id)
    if logs is None:
        return []
    lines: list[str] = []
    for name in ("traceback", "stdout", "stderr"):
        text: str = getattr(logs, name)
        if text.strip():
            lines.append(f"     --- {name} ---")
            lines.extend("       " + line for line in text.splitlines())
    return lines


def render_text(pop: Population, cand: Candidate, *, logs: bool = False) -> str:
    """What `evolve show` prints, terminal controls in it escaped."""
    workload = pop.workload(cand.workload_id)
    promos = [p for p in pop.promotions(cand.workload_id) if p.candidate_id == cand.id]
    best = pop.best(cand.workload_id)
    lines = [
        f"candidate {cand.id}  {cand.label}",
        f"  workload   {workload.name if workload else cand.workload_id}",
        f"  directory  {cand.directory}",
        f"  origin     {cand.origin}" + (f", family {cand.family}" if cand.family else "")
        + (f", operator {cand.operator}" if cand.operator else "") + f", generation {cand.generation}",
        f"  digest     {cand.digest}",
        f"  created    {cand.created_at:%Y-%m-%d %H:%M:%S}Z" + (f" by run {cand.run_id}" if cand.run_id else ""),
    ]
    if cand.author:
        lines.append(f"  author     {cand.author}")
    if cand.notes:
        lines.append(f"  notes      {cand.notes}")
    if cand.params:
        lines.append(f"  params     {json.dumps(cand.params, sort_keys=True)}")
    for p in promos:
        current = " (current best)" if best and best.id == p.id else ""
        lines.append(
            f"  promoted   {p.promoted_at:%Y-%m-%d %H:%M:%S}Z over {p.previous_best_id or 'nothing'}"
            f", +{(p.speedup_over_best or 0):.3f}x, confirmations {p.confirmation_eval_ids}{current}"
        )
    evaluations = pop.evaluations(cand.id)
    lines.append(f"stages ({len(evaluations)} evaluations):")
    if not evaluations:
        lines.append("  (not evaluated yet)")
    for ev in evaluations:
        lines.extend(_evaluation_lines(ev))
        if logs:
            lines.extend(_log_lines(pop, ev))
    lines.append("lineage:")
    ancestors = pop.ancestors(cand.id)
    if not ancestors:
        lines.append("  (no parents)")
    for depth, anc in ancestors:
        lines.append(f"  {'  ' * (depth - 1)}^ {anc.id} {anc.label} ({anc.operator or anc.origin}, gen {anc.generation})")
    for child in pop.children(cand.id):
        lines.append(f"  v {child.id} {child.label} ({child.operator or child.origin}, gen {child.generation})")
    # Messages, logs, names and notes come from candidates: no terminal controls through.
    return safe_text("\n".join(lines))


def _evaluation_json(pop: Population, ev: Evaluation, logs: bool) -> dict[str, Any]:
    doc = ev.model_dump(mode="json")
    if logs:
        stored = pop.evaluation_logs(ev.id)
        doc["logs"] = None if stored is None else stored.model_dump()
    return doc


def render_json(pop: Population, cand: Candidate, *, logs: bool = False) -> str:
    doc = {
        "candidate": cand.model_dump(mode="json"),
        "evaluations": [_evaluation_json(pop, e, logs) for e in pop.evaluations(cand.id)],
        "ancestors": [{"depth": d, **a.model_dump(mode="json")} for d, a in pop.ancestors(cand.id)],
        "children": [c.model_dump(mode="json") for c in pop.children(cand.id)],
        "promotions": [p.model_dump(mode="json") for p in pop.promotions(cand.workload_id) if p.candidate_id == cand.id],
    }
    return json.dumps(doc, indent=2)


def _run(args: argparse.Namespace) -> int:
    try:
        pop = Population.open(args.db)
    except SchemaVersionError as exc:
        print(f"evolve show: {exc}", file=sys.stderr)
        return 2
    cand = find_candidate(pop, args.id)
    if cand is None:
        print(f"evolve show: no candidate with id or directory {args.id!r}", file=sys.stderr)
        return 1
    print(render_json(pop, cand, logs=args.logs) if args.json else render_text(pop, cand, logs=args.logs))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("show", help="one candidate: stages, metrics, lineage, logs")
    p.add_argument("id", help="candidate id or directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--logs", action="store_true",
                   help="also print each stage's stored stdout, stderr and traceback in full")
    p.add_argument("--db", help=DB_HELP)
    p.set_defaults(func=_run)

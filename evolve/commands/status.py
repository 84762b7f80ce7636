"""`evolve status`: runs, evaluation counts, in-flight stages and the confirmed best."""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import Any

from evolve.commands.jsonout import add_json_flag, emit
from evolve.db import DB_HELP, SchemaVersionError
from evolve.db.models import utcnow
from evolve.population import Population


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render_status(pop: Population, workload_id: int | None = None) -> str:
    now = utcnow()
    names = {w.id: w.name for w in pop.workloads()}
    lines = ["runs:"]
    runs = pop.runs(workload_id)
    if not runs:
        lines.append("  (none)")
    shown_runs = runs[-20:]
    throughput = pop.run_throughputs(shown_runs)
    for run in shown_runs:
        alive = pop.run_alive(run)
        if run.state == "running":
            state = "running" if alive else "running (dead: no heartbeat or process)"
        else:
            state = run.state
        heartbeat = _age((now - run.heartbeat_at).total_seconds())
        lines.append(
            f"  run {run.id} {names.get(run.workload_id, run.workload_id)} {run.strategy}: {state}, "
            f"heartbeat {heartbeat} ago, {run.host}:{run.pid}, started {run.started_at:%Y-%m-%d %H:%M}Z"
        )
        workers = pop.workers(run.id)
        if len(workers) > 1:   # a shared run (`evolve run --join`): who works on it
            live = [w for w in workers if pop.worker_alive(w)]
            lines.append(f"    {len(live)} of {len(workers)} worker(s) alive: "
                         + ", ".join(f"{w.host}:{w.pid}" for w in live))
        tp = throughput[run.id]
        if tp.stages:
            # under a minute of wall time (no heartbeat yet) makes rates meaningless
            rates = (f"{tp.benched_per_hour:.0f} candidates/h, {tp.stages_per_hour:.0f} stages/h"
                     if tp.wall_s >= 60 else "rates after a minute")
            lines.append(
                f"    {tp.benched} candidate(s) benched and {tp.stages} stage(s) finished in {_age(tp.wall_s)}: "
                f"{rates}, GPU lease held by its finished stages {tp.lease_held_s:.0f} s"
            )

    lines.append("evaluations:")
    counts = pop.status_counts(workload_id)
    if not counts:
        lines.append("  (none)")
    by_stage: dict[str, list[str]] = defaultdict(list)
    for c in counts:
        label = c.status if c.failure_kind is None else f"{c.status}/{c.failure_kind}"
        by_stage[c.stage].append(f"{label}={c.count}")
    for stage, parts in by_stage.items():
        lines.append(f"  {stage:<8} " + " ".join(parts))
    kinds: dict[str, int] = defaultdict(int)
    for c in counts:
        if c.failure_kind:
            kinds[c.failure_kind] += c.count
    if kinds:
        lines.append("  failure kinds: " + " ".join(f"{k}={n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])))

    running = pop.evaluations_of(workload_id, status="running")
    orphaned = {e.id for e in pop.interrupted()}
    lines.append(f"in flight ({len(running)}):")
    for ev in running:
        cand = pop.candidate(ev.candidate_id)
        tag = "  (orphaned: its run is dead)" if ev.id in orphaned else ""
        lines.append(
            f"  #{ev.id} {ev.stage} attempt {ev.attempt} of candidate {ev.candidate_id}"
            f" {cand.label if cand else ''}, {_age((now - ev.started_at).total_seconds())}, run {ev.run_id}{tag}"
        )

    lines.append("confirmed best:")
    shown = False
    for wid, name in names.items():
        if workload_id is not None and wid != workload_id:
            continue
        best = pop.best(wid)
        if best is None:
            continue
        shown = True
        cand = pop.candidate(best.candidate_id)
        benches = [e for e in pop.evaluations(best.candidate_id, stage="bench") if e.status == "passed" and e.speedup]
        top = max(benches, key=lambda e: e.speedup or 0.0, default=None)
        speed = "-" if top is None else f"{top.speedup:.3f}x" + (f", {top.ms:.4f} ms" if top.ms is not None else "")
        lines.append(
            f"  {name}: candidate {best.candidate_id} {cand.label if cand else ''} ({speed}), "
            f"promoted {best.promoted_at:%Y-%m-%d %H:%M}Z"
        )
    if not shown:
        lines.append("  (none yet)")
    return "\n".join(lines)


def status_doc(pop: Population, workload_id: int | None = None) -> dict[str, Any]:
    """What render_status says, as data."""
    runs = pop.runs(workload_id)[-20:]
    throughput = pop.run_throughputs(runs)
    orphaned = {e.id for e in pop.interrupted()}
    best = []
    for w in pop.workloads():
        found = pop.best(w.id) if workload_id is None or w.id == workload_id else None
        if found is not None:
            best.append({"workload": w.name, **found.model_dump(mode="json"),
                         "bench_speedup": pop.bench_speedup(found.candidate_id)})
    return {
        "runs": [{**r.model_dump(mode="json"), "alive": pop.run_alive(r),
                  "throughput": throughput[r.id].model_dump(mode="json"),
                  "workers": [{**w.model_dump(mode="json"), "alive": pop.worker_alive(w)} for w in pop.workers(r.id)]}
                 for r in runs],
        "evaluations": [c.model_dump(mode="json") for c in pop.status_counts(workload_id)],
        "in_flight": [{**e.model_dump(mode="json", exclude={"metrics"}), "orphaned": e.id in orphaned}
                      for e in pop.evaluations_of(workload_id, status="running")],
        "best": best,
    }


def _run(args: argparse.Namespace) -> int:
    try:
        pop = Population.open(args.db)
        workload_id = pop.workload_id(args.workload)
        if args.json:
            emit(status_doc(pop, workload_id))
        else:
            print(render_status(pop, workload_id))
    except (SchemaVersionError, KeyError) as exc:
        print(f"evolve status: {exc}", file=sys.stderr)
        return 2
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("status", help="runs, evaluation counts, in-flight stages, confirmed best")
    p.add_argument("--workload", help="only this workload (name or id)")
    p.add_argument("--db", help=DB_HELP)
    add_json_flag(p)
    p.set_defaults(func=_run)

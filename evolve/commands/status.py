"""`evolve status`: runs, evaluation counts, in-flight stages and the confirmed best.
`build_status` reads them; the text and JSON views only format what it read."""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from evolve.commands.jsonout import add_json_flag, emit
from evolve.db import DB_HELP, SchemaVersionError
from evolve.db.models import utcnow
from evolve.db.records import RunThroughput, StatusCount
from evolve.population import Evaluation, Population, Promotion, Run, RunWorker
from evolve.safe_text import safe_text
from evolve.vocabulary import EvaluationStatus, RunState, Stage

SHOWN_RUNS = 20     # the latest runs shown; older ones are in `evolve report`


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@dataclass(frozen=True)
class RunStatus:
    run: Run
    alive: bool
    throughput: RunThroughput
    workers: list[tuple[RunWorker, bool]]    # each worker of the run, and whether it is alive


@dataclass(frozen=True)
class InFlight:
    evaluation: Evaluation
    label: str           # its candidate's label
    orphaned: bool       # its run is dead


@dataclass(frozen=True)
class BestStatus:
    workload: str
    promotion: Promotion
    label: str
    bench_speedup: float | None      # its latest bench, as the search sees it
    top: Evaluation | None           # its fastest passed bench


@dataclass(frozen=True)
class StatusData:
    now: datetime
    workload_names: dict[int, str]
    any_runs: bool
    runs: list[RunStatus]            # the latest SHOWN_RUNS
    counts: list[StatusCount]
    in_flight: list[InFlight]
    best: list[BestStatus]


def build_status(pop: Population, workload_id: int | None = None) -> StatusData:
    names = {w.id: w.name for w in pop.workloads()}
    runs = pop.runs(workload_id)
    shown = runs[-SHOWN_RUNS:]
    throughput = pop.run_throughputs(shown)
    orphaned = {e.id for e in pop.interrupted()}
    in_flight = []
    for ev in pop.evaluations_of(workload_id, status=EvaluationStatus.RUNNING):
        cand = pop.candidate(ev.candidate_id)
        in_flight.append(InFlight(ev, cand.label if cand else "", ev.id in orphaned))
    best = []
    for wid, name in names.items():
        found = pop.best(wid) if workload_id is None or wid == workload_id else None
        if found is None:
            continue
        cand = pop.candidate(found.candidate_id)
        benches = [e for e in pop.evaluations(found.candidate_id, stage=Stage.BENCH)
                   if e.status == EvaluationStatus.PASSED and e.speedup]
        best.append(BestStatus(name, found, cand.label if cand else "", pop.bench_speedup(found.candidate_id),
                               max(benches, key=lambda e: e.speedup or 0.0, default=None)))
    return StatusData(
        now=utcnow(), workload_names=names, any_runs=bool(runs),
        runs=[RunStatus(r, pop.run_alive(r), throughput[r.id], [(w, pop.worker_alive(w)) for w in pop.workers(r.id)])
              for r in shown],
        counts=pop.status_counts(workload_id), in_flight=in_flight, best=best)


# ---- the text view -----------------------------------------------------------------------
def _run_lines(data: StatusData) -> list[str]:
    lines = ["runs:"]
    if not data.any_runs:
        lines.append("  (none)")
    for rs in data.runs:
        run = rs.run
        if run.state == RunState.RUNNING:
            state = "running" if rs.alive else "running (dead: no heartbeat or process)"
        else:
            state = run.state
        heartbeat = _age((data.now - run.heartbeat_at).total_seconds())
        lines.append(
            f"  run {run.id} {data.workload_names.get(run.workload_id, run.workload_id)} {run.strategy}: {state}, "
            f"heartbeat {heartbeat} ago, {run.host}:{run.pid}, started {run.started_at:%Y-%m-%d %H:%M}Z"
        )
        if len(rs.workers) > 1:   # a shared run (`evolve run --join`): who works on it
            live = [w for w, alive in rs.workers if alive]
            lines.append(f"    {len(live)} of {len(rs.workers)} worker(s) alive: "
                         + ", ".join(f"{w.host}:{w.pid}" for w in live))
        tp = rs.throughput
        if tp.stages:
            # under a minute of wall time (no heartbeat yet) makes rates meaningless
            rates = (f"{tp.benched_per_hour:.0f} candidates/h, {tp.stages_per_hour:.0f} stages/h"
                     if tp.wall_s >= 60 else "rates after a minute")
            lines.append(
                f"    {tp.benched} candidate(s) benched and {tp.stages} stage(s) finished in {_age(tp.wall_s)}: "
                f"{rates}, GPU lease held by its finished stages {tp.lease_held_s:.0f} s"
            )
    return lines


def _evaluation_lines(data: StatusData) -> list[str]:
    lines = ["evaluations:"]
    if not data.counts:
        lines.append("  (none)")
    by_stage: dict[str, list[str]] = defaultdict(list)
    kinds: dict[str, int] = defaultdict(int)
    for c in data.counts:
        label = c.status if c.failure_kind is None else f"{c.status}/{c.failure_kind}"
        by_stage[c.stage].append(f"{label}={c.count}")
        if c.failure_kind:
            kinds[c.failure_kind] += c.count
    for stage, parts in by_stage.items():
        lines.append(f"  {stage:<8} " + " ".join(parts))
    if kinds:
        lines.append("  failure kinds: " + " ".join(f"{k}={n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])))
    return lines


def _in_flight_lines(data: StatusData) -> list[str]:
    lines = [f"in flight ({len(data.in_flight)}):"]
    for f in data.in_flight:
        ev = f.evaluation
        tag = "  (orphaned: its run is dead)" if f.orphaned else ""
        lines.append(
            f"  #{ev.id} {ev.stage} attempt {ev.attempt} of candidate {ev.candidate_id}"
            f" {f.label}, {_age((data.now - ev.started_at).total_seconds())}, run {ev.run_id}{tag}"
        )
    return lines


def _best_lines(data: StatusData) -> list[str]:
    lines = ["confirmed best:"]
    for b in data.best:
        top = b.top
        speed = "-" if top is None else f"{top.speedup:.3f}x" + (f", {top.ms:.4f} ms" if top.ms is not None else "")
        lines.append(
            f"  {b.workload}: candidate {b.promotion.candidate_id} {b.label} ({speed}), "
            f"promoted {b.promotion.promoted_at:%Y-%m-%d %H:%M}Z"
        )
    if not data.best:
        lines.append("  (none yet)")
    return lines


def format_status(data: StatusData) -> str:
    # Candidates' labels are an agent's choice: no terminal controls through.
    return safe_text("\n".join(_run_lines(data) + _evaluation_lines(data) + _in_flight_lines(data) + _best_lines(data)))


def render_status(pop: Population, workload_id: int | None = None) -> str:
    return format_status(build_status(pop, workload_id))


# ---- the JSON view -----------------------------------------------------------------------
def status_json(data: StatusData) -> dict[str, Any]:
    """What format_status says, as data."""
    return {
        "runs": [{**rs.run.model_dump(mode="json"), "alive": rs.alive,
                  "throughput": rs.throughput.model_dump(mode="json"),
                  "workers": [{**w.model_dump(mode="json"), "alive": alive} for w, alive in rs.workers]}
                 for rs in data.runs],
        "evaluations": [c.model_dump(mode="json") for c in data.counts],
        "in_flight": [{**f.evaluation.model_dump(mode="json", exclude={"metrics"}), "orphaned": f.orphaned}
                      for f in data.in_flight],
        "best": [{"workload": b.workload, **b.promotion.model_dump(mode="json"), "bench_speedup": b.bench_speedup}
                 for b in data.best],
    }


def status_doc(pop: Population, workload_id: int | None = None) -> dict[str, Any]:
    return status_json(build_status(pop, workload_id))


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


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("status", help="runs, evaluation counts, in-flight stages, confirmed best")
    p.add_argument("--workload", help="only this workload (name or id)")
    p.add_argument("--db", help=DB_HELP)
    add_json_flag(p)
    p.set_defaults(func=_run)

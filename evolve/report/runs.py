"""Per-run sections of the report: the config a run was started with, what failed in it
(grouped by kind and first message line) and its confirmation measurements."""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from evolve.breaker import failure_signature
from evolve.db.records import Evaluation, Promotion, Run, RunThroughput
from evolve.population import Population
from evolve.vocabulary import EvaluationStatus, Stage

EXAMPLES = 5


@dataclass(frozen=True)
class FailureGroup:
    stage: str
    kind: str
    message: str                    # the first line, as the circuit breaker groups them
    count: int
    candidates: list[int]           # a few examples


@dataclass(frozen=True)
class Confirmation:
    evaluation_id: int
    candidate_id: int
    status: str
    speedup: float | None           # over the incumbent (or the baseline for the first best)
    spread: float | None
    ms: float | None
    baseline_ms: float | None       # the incumbent's time in the same run
    message: str
    promotion: Promotion | None     # the promotion these runs led to, if any


@dataclass(frozen=True)
class RunSection:
    run: Run
    config: str                     # pretty JSON
    throughput: RunThroughput | None
    failures: list[FailureGroup]
    confirmations: list[Confirmation]


def _failures(failed: list[Evaluation]) -> list[FailureGroup]:
    groups: dict[tuple[str, str, str], list[Evaluation]] = defaultdict(list)
    for ev in failed:
        kind, signature = failure_signature(ev.failure_kind or "?", ev.message)
        groups[(ev.stage, kind, signature)].append(ev)
    out = []
    for (stage, kind, _), evs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        first = next((line for line in evs[0].message.splitlines() if line.strip()), "")
        cands = list(dict.fromkeys(e.candidate_id for e in evs))
        out.append(FailureGroup(stage, kind, first, len(evs), cands[:EXAMPLES]))
    return out


def run_sections(pop: Population, workload_id: int | None, promotions: list[Promotion]) -> list[RunSection]:
    runs = sorted(pop.runs(workload_id), key=lambda r: r.id, reverse=True)
    throughput = pop.run_throughputs(runs) if runs else {}
    by_eval = {eid: p for p in promotions for eid in p.confirmation_eval_ids}
    sections = []
    for run in runs:
        failed = pop.evaluations_of(workload_id, status=EvaluationStatus.FAILED, run_id=run.id)
        confirms = pop.evaluations_of(workload_id, stage=Stage.CONFIRM, run_id=run.id)
        sections.append(RunSection(
            run=run, config=json.dumps(run.config, indent=2, sort_keys=True, default=str),
            throughput=throughput.get(run.id), failures=_failures(failed),
            confirmations=[Confirmation(e.id, e.candidate_id, e.status, e.speedup, e.spread, e.ms, e.baseline_ms,
                                        e.message, by_eval.get(e.id)) for e in confirms]))
    return sections

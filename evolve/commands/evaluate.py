"""`evolve evaluate ID|PATH`: run one candidate of the population through the pipeline now."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

from kcoral import Client, RemoteError
from rich.console import Console

from evolve.commands.jsonout import add_json_flag, emit
from evolve.commands.register import RegisterError, register_candidate
from evolve.config import SET_HELP, ConfigError, PromotionConfig, RemoteConfig, default_stages, load_config
from evolve.db import DB_HELP, SchemaVersionError, open_database
from evolve.digest import DigestError, source_digest
from evolve.embedded import EmbeddedServer, EmbeddedServerError
from evolve.families import FamilyError
from evolve.loop import server_concurrency
from evolve.paths import display_path
from evolve.pipeline import GpuGate, StageContext, run_pipeline
from evolve.pipeline import bench as bench_stage
from evolve.pipeline.runner import run_stage
from evolve.population import Candidate, Population, StageResult
from evolve.promotion import Promoter
from evolve.safe_text import safe_line, safe_text
from evolve.stage_progress import StageProgress
from evolve.vocabulary import PIPELINE_STAGES, EvaluationStatus, Stage


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("evaluate", help="evaluate one registered candidate now",
                              description="Run a candidate (by id or directory) through the stage pipeline "
                                          "and, if it beats the confirmed best, through confirmation.")
    p.add_argument("candidate", metavar="ID|PATH", help="candidate id, or its directory")
    p.add_argument("--remote", default=None, help="KCoral server URL (default: $KCORAL_REMOTE, else embedded)")
    p.add_argument("--db", default=None, help=DB_HELP)
    p.add_argument("--config", default=None,
                   help="run config whose stages and promotion policy to use (default: check, gputest, bench)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=SET_HELP + "; needs --config")
    p.add_argument("--rebench", type=int, default=None, metavar="N",
                   help="then run the official benchmark N more times (stage 'rebench'; needs a passed bench)")
    add_json_flag(p)
    p.set_defaults(func=main)


def find_candidate(pop: Population, key: str) -> Candidate | None:
    """The candidate with this id, or the one registered at this directory (newest)."""
    if key.isdigit():
        return pop.candidate(int(key))
    path = Path(key)
    for form in (display_path(path), key.rstrip("/"), str(path.resolve())):
        cand = pop.candidate_by_directory(form)
        if cand is not None:
            return cand
    return None


def current_candidate(pop: Population, key: str, registered: Candidate) -> Candidate:
    """What a directory holds now: `registered` if unchanged, else the candidate of its
    present sources (registered as an edit of `registered` when new)."""
    if key.isdigit():
        return registered
    digest = source_digest(Path(key))
    if digest == registered.digest:
        return registered
    same = pop.candidate_by_digest(registered.workload_id, digest)
    if same is not None:
        return same
    workload = pop.workload(registered.workload_id)
    assert workload is not None
    cid, _ = register_candidate(pop, Path(key), workload=workload.name, edit_of=registered.id)
    cand = pop.candidate(cid)
    assert cand is not None
    print(f"evolve evaluate: {key} changed since candidate {registered.id}; its sources are now "
          f"candidate {cid} (an edit of {registered.id})", file=sys.stderr)
    return cand


def rebench(ctx: StageContext, cand: Candidate, runs: int) -> list[StageResult]:
    """`runs` fresh official benchmarks of `cand`, each its own 'rebench' row."""
    results: list[StageResult] = []
    for _ in range(runs):
        if ctx.cancel.is_set():
            break
        _eid, result = run_stage(ctx, Stage.REBENCH, cand, fn=lambda copy: bench_stage.run(ctx, copy))
        assert result is not None  # rebench is repeatable: the claim is never refused
        results.append(result)
    return results


def rebench_summary(results: list[StageResult]) -> str:
    speedups = [r.speedup for r in results if r.status == EvaluationStatus.PASSED and r.speedup is not None]
    failed = sum(r.status != EvaluationStatus.PASSED for r in results)
    if not speedups:
        return f"rebench: {len(results)} runs, none passed"
    spreads = [r.spread for r in results if r.spread is not None]
    return (f"rebench: {len(results)} runs, speedup mean {statistics.fmean(speedups):.3f}x "
            f"(min {min(speedups):.3f}x, max {max(speedups):.3f}x)"
            + (f", widest spread {max(spreads):.1%}" if spreads else "") + (f", {failed} failed" if failed else ""))


def main(args: argparse.Namespace) -> int:
    if args.rebench is not None and args.rebench < 1:
        print("evolve evaluate: error: --rebench needs a number of runs of at least 1", file=sys.stderr)
        return 2
    if args.overrides and not args.config:
        print("evolve evaluate: error: --set overrides a config's settings: give the config with --config",
              file=sys.stderr)
        return 2
    try:
        db = open_database(args.db)
    except SchemaVersionError as exc:
        print(f"evolve evaluate: error: {exc}", file=sys.stderr)
        return 2
    pop = Population(db)
    cand = find_candidate(pop, args.candidate)
    if cand is None:
        print(f"evolve evaluate: error: {args.candidate} is not in the population; "
              f"add it with `evolve register PATH` first", file=sys.stderr)
        return 2
    try:
        cand = current_candidate(pop, args.candidate, cand)
    except (DigestError, RegisterError) as exc:
        print(f"evolve evaluate: error: {exc}", file=sys.stderr)
        return 2
    workload = pop.workload(cand.workload_id)
    assert workload is not None
    try:
        config = load_config(args.config, args.overrides) if args.config else None
        families = config.load_families() if config else {}
    except (ConfigError, FamilyError) as exc:
        print(f"evolve evaluate: error: {exc}", file=sys.stderr)
        return 2
    stages_cfg = config.stages if config else default_stages()
    stages = [s for s in PIPELINE_STAGES if stages_cfg[s].enabled]
    policy = config.promotion if config else PromotionConfig()
    remote = config.remote if config else RemoteConfig()
    url = args.remote or os.environ.get("KCORAL_REMOTE") or remote.url
    server = nullcontext(url) if url else EmbeddedServer(cpu_workers=remote.embedded_cpu_workers,
                                                         workload=workload.path)
    try:
        # One attempt per call: the pipeline owns the retries (evolve.pipeline.errors).
        with server as server_url, Client(server_url, retries=1) as client:
            slots = remote.concurrency or server_concurrency(client.health())
            ctx = StageContext(client=client, pop=pop, workload_id=cand.workload_id,
                               workload_dir=Path(workload.path).resolve(), run_id=None, stages=stages_cfg,
                               families=families, gate=GpuGate(client, slots, remote.max_queue),
                               transport_wait_s=remote.transport_wait_s)
            with StageProgress(Console(stderr=True)) as view:
                ctx.listener = view
                outcome = run_pipeline(ctx, cand, stages)
                decision = Promoter(ctx, policy).consider(cand, outcome.bench) \
                    if outcome.passed and outcome.bench is not None else None
                rebenched: list[StageResult] | None = None
                if args.rebench and outcome.passed and Stage.BENCH in stages:
                    rebenched = rebench(ctx, cand, args.rebench)
    except EmbeddedServerError as exc:
        print(safe_text(f"evolve evaluate: error: {exc}"), file=sys.stderr)
        return 1
    except RemoteError as exc:   # the server's words may quote the candidate's output
        print(safe_text(f"evolve evaluate: error: the server failed: {exc}"), file=sys.stderr)
        return 1
    if args.json:
        emit({"candidate_id": cand.id, "passed": outcome.passed, "skipped": outcome.skipped,
              "stage": outcome.stage, "failure_kind": outcome.failure_kind, "message": outcome.message,
              "evaluations": [e.model_dump(mode="json") for e in pop.evaluations(cand.id)],
              "decision": decision.model_dump(mode="json") if decision else None,
              "rebench": None if rebenched is None else {
                  "summary": rebench_summary(rebenched),
                  "speedups": [r.speedup for r in rebenched], "spreads": [r.spread for r in rebenched]}})
        return 0 if outcome.passed else 1
    # Messages and reasons quote the candidate: shown with its terminal controls escaped.
    for ev in pop.evaluations(cand.id):
        extra = f" {ev.speedup:.3f}x ({ev.ms:.4f} ms)" if ev.speedup is not None and ev.ms is not None else ""
        kind = f" [{ev.failure_kind}]" if ev.failure_kind else ""
        print(safe_line(f"#{ev.id} {ev.stage:8s} {ev.status}{kind}{extra} {ev.message[:200]}".rstrip()))
    if decision is not None:
        print(safe_line(f"{'promoted' if decision.promoted else 'not promoted'}: {decision.reason}"))
    if rebenched is not None:
        print(rebench_summary(rebenched))
    elif args.rebench:
        print(f"rebench: not run (candidate {cand.id} has no passed bench)")
    if outcome.skipped:
        print(safe_line(f"candidate {cand.id}: {outcome.message}"))
    return 0 if outcome.passed else 1

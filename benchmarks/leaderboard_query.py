"""Leaderboard query time on a large population, and the database cost per candidate.

Fills a fresh SQLite database with N evaluations (bulk insert, bypassing the ORM), then
times the read queries the CLI and the search use, and the per-operation cost of the
writes the orchestrator makes for every candidate. Prints a table.

    python benchmarks/leaderboard_query.py [--evaluations 100000] [--repeat 30] [--db URL | --postgres]

`--postgres` runs it on a throwaway PostgreSQL server on loopback (tests/pgserver.py:
initdb + pg_ctl, durability off); `--db postgresql+psycopg://...` on an existing one.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import insert, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evolve.db import open_database
from evolve.db.models import CandidateModel, EvaluationModel, utcnow
from evolve.population import NewCandidate, Population, StageResult
from evolve.report import render_report

STAGES = ("check", "gputest", "ncu", "bench", "confirm")
KINDS = ("compile", "correctness", "timeout", "runtime")


def fill(pop: Population, workload_id: int, n_evaluations: int, seed: int = 7) -> int:
    """Bulk-insert candidates with 5 evaluations each (some fail early); returns candidates."""
    rng = random.Random(seed)
    n_candidates = n_evaluations // len(STAGES)
    start = utcnow() - timedelta(days=2)
    with pop.db.write() as s:
        s.execute(
            insert(CandidateModel),
            [
                {
                    "workload_id": workload_id,
                    "origin": "template",
                    "family": rng.choice(("two_pass", "fused", "chunked")),
                    "params": {"chunk": rng.choice((32, 64)), "v_block": rng.choice((32, 64, 128))},
                    "digest": f"{i:064x}",
                    "directory": f"kcoral/workloads/kda/bench/gen/{i:064x}",
                    "generation": i // 100,
                    "created_at": start + timedelta(seconds=i),
                    "claimed_at": start + timedelta(seconds=i),   # every one has evaluations below
                }
                for i in range(n_candidates)
            ],
        )
        first_id = s.scalar(CandidateModel.__table__.select().with_only_columns(CandidateModel.id).order_by(CandidateModel.id).limit(1))
    rows = []
    for c in range(n_candidates):
        cid = first_id + c  # type: ignore[operator]
        t = start + timedelta(seconds=c * 5)
        for attempt_stage in STAGES:
            failed = rng.random() < 0.15
            speedup = rng.lognormvariate(0.0, 0.4) if attempt_stage in ("bench", "confirm") else None
            rows.append(
                {
                    "candidate_id": cid,
                    "stage": attempt_stage,
                    "attempt": 1,
                    "status": "failed" if failed else "passed",
                    "failure_kind": rng.choice(KINDS) if failed else None,
                    "message": "",
                    "metrics": {},
                    "started_at": t,
                    "ended_at": t + timedelta(seconds=1),
                    "ms": 2.0 / speedup if speedup else None,
                    "baseline_ms": 2.0 if speedup else None,
                    "speedup": speedup,
                    "excessive_sectors": rng.randrange(0, 200_000) if attempt_stage == "ncu" else None,
                }
            )
    with pop.db.write() as s:
        for i in range(0, len(rows), 20_000):
            s.execute(insert(EvaluationModel), rows[i : i + 20_000])
    pop.recompute_best_speedups()  # bulk inserts bypass finish_stage, which keeps it
    return n_candidates


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm the page cache and statement cache
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evaluations", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=30, help="repeats of the fast queries (whole-population reads: 3)")
    ap.add_argument("--ops", type=int, default=300, help="candidates for the per-operation costs")
    ap.add_argument("--db", help="database URL (default: a fresh SQLite file in a temporary folder)")
    ap.add_argument("--postgres", action="store_true", help="a throwaway PostgreSQL server instead of SQLite")
    args = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory()
    server = None
    if args.postgres:
        from tests.pgserver import TemporaryPostgres

        server = TemporaryPostgres().start()
        url = server.create_database("bench")
    else:
        url = args.db or f"sqlite:///{Path(tmp.name) / 'bench.db'}"
    pop = Population(open_database(url))
    wid = pop.ensure_workload("bench_workload", "kcoral/workloads/kda/bench_workload")
    t0 = time.perf_counter()
    n_candidates = fill(pop, wid, args.evaluations)
    if pop.db.is_postgresql:
        # Planner statistics, as autovacuum gathers them after a bulk load on a live server.
        with pop.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    fill_s = time.perf_counter() - t0
    if pop.db.is_postgresql:
        with pop.db.engine.connect() as conn:
            engine_version = "postgresql " + str(conn.execute(text("SHOW server_version")).scalar())
    else:
        engine_version = f"sqlite {sqlite3.sqlite_version}"

    # (name, call, repeats): the whole-population reads are repeated less often.
    few = max(1, min(args.repeat, 3))
    queries: list[tuple[str, Callable[[], object], int]] = [
        ("leaderboard(workload, limit=20)", lambda: pop.leaderboard(wid, limit=20), args.repeat),
        ("leaderboard(all workloads, limit=20)", lambda: pop.leaderboard(None, limit=20), args.repeat),
        ("leaderboard(workload, limit=100)", lambda: pop.leaderboard(wid, limit=100), args.repeat),
        ("best(workload)", lambda: pop.best(wid), args.repeat),
        ("unevaluated(workload)", lambda: pop.unevaluated(wid), args.repeat),
        ("claim_next(workload): none waiting (every new job)", lambda: pop.claim_next(wid, "check"), args.repeat),
        ("status_counts()", lambda: pop.status_counts(), few),
        ("correct(workload): every correct candidate", lambda: pop.correct(wid), few),
        ("evaluations_of(workload): every evaluation", lambda: pop.evaluations_of(wid), few),
        ("evaluation_summaries(workload): every evaluation", lambda: pop.evaluation_summaries(wid), few),
        ("render_report(workload)", lambda: render_report(pop, wid), few),
    ]
    print(f"# {args.evaluations:,} evaluations over {n_candidates:,} candidates, filled in {fill_s:.1f} s")
    print(f"# python {platform.python_version()}, {engine_version}, {platform.machine()}, "
          f"{platform.system()}, {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}")
    print()
    print("| query | median ms | p95 ms | min ms | rows (report: bytes) |")
    print("|---|---:|---:|---:|---:|")
    for name, fn, repeat in queries:
        times = sorted(timed(fn, repeat))
        result = fn()
        nrows = len(result) if isinstance(result, (list, str)) else int(result is not None)
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
        print(f"| {name} | {statistics.median(times):.2f} | {p95:.2f} | {times[0]:.2f} | {nrows} |")

    # Per-operation write costs on the same (large) database.
    run = pop.start_run(wid, {}, "benchmark")
    adds, begins, finishes = [], [], []
    for i in range(args.ops):
        t = time.perf_counter()
        cand, _ = pop.add_candidate(
            NewCandidate(workload_id=wid, origin="template", family="two_pass", params={"i": i},
                         digest=f"op{i}", directory=f"gen/op{i}", parents=[1], generation=1, operator="mutate", run_id=run)
        )
        adds.append((time.perf_counter() - t) * 1000)
        for stage in ("check", "gputest", "bench"):
            t = time.perf_counter()
            eid = pop.begin_stage(cand.id, stage, run_id=run)
            begins.append((time.perf_counter() - t) * 1000)
            assert eid is not None
            t = time.perf_counter()
            pop.finish_stage(eid, StageResult(status="passed", speedup=1.0, ms=2.0, baseline_ms=2.0))
            finishes.append((time.perf_counter() - t) * 1000)
    print()
    print("| write operation | mean ms | median ms | p95 ms |")
    print("|---|---:|---:|---:|")
    for name, times in (("add_candidate", adds), ("begin_stage", begins), ("finish_stage", finishes)):
        st = sorted(times)
        print(f"| {name} | {statistics.fmean(st):.2f} | {statistics.median(st):.2f} | {st[int(0.95 * len(st))]:.2f} |")
    per_candidate = statistics.fmean(adds) + 5 * (statistics.fmean(begins) + statistics.fmean(finishes))
    print(f"| per candidate (add + 5 stages × (begin + finish)) | {per_candidate:.2f} | | |")
    pop.db.close()
    if server is not None:
        server.stop()
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

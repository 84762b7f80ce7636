"""What a proposal costs with a large population in the database.

Fills a fresh SQLite database with N candidates of a recorded landscape's family (real
points and their recorded times: a passed check and a bench each, failures as failed
checks; bulk insert), then times what `evolve run` does per proposal: reading the search
state from the population (`evolve.search_view.SearchView`, whose first read is the whole
population) and the strategy's `propose`: per proposal the median and mean wall
time, and the median CPU time of this process (on a shared machine, what the proposal
costs rather than how long it waited for a core). The first `--warmup` proposals read the
population whole and build the strategy's caches (the model's encoded space): a cost per
run, shown apart. Prints a table (`--json`: JSON).

With `--family DIR` the population is instead N admitted points of one of our template
families (drawn uniformly, with made-up times): its space is the family's own, constraints and
all, as `evolve run` searches it.

    python benchmarks/search_overhead.py [--candidates 10000] [--proposals 20] [--landscape L.csv.gz]
    python benchmarks/search_overhead.py --family evolve/templates/kda/two_pass --candidates 1000
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from evolve.config import StrategyConfig  # noqa: E402
from evolve.families import load_family  # noqa: E402
from evolve.db.models import CandidateModel, EvaluationModel, utcnow  # noqa: E402
from evolve.search_view import SearchView  # noqa: E402
from evolve.population import Population  # noqa: E402
from evolve.replay.landscape import Landscape, Point, load_landscape  # noqa: E402
from evolve.strategies import make_strategy, point_key  # noqa: E402

DEFAULT = REPO / "benchmarks" / "landscapes" / "gemm-RTX3090.csv.gz"


def fill(pop: Population, workload_id: int, landscape, n: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    points = rng.sample(landscape.points, min(n, len(landscape.points)))
    ref = statistics.median(landscape.times())
    start = utcnow() - timedelta(days=1)
    with pop.db.write() as s:
        s.execute(insert(CandidateModel), [
            {"workload_id": workload_id, "origin": "template", "family": landscape.name, "params": p.params,
             "digest": f"{i:064x}", "directory": f"gen/{i:064x}", "generation": 0,
             "created_at": start + timedelta(seconds=i)} for i, p in enumerate(points)])
        first = s.scalar(CandidateModel.__table__.select().with_only_columns(CandidateModel.id)
                         .order_by(CandidateModel.id).limit(1))
    rows = []
    for i, p in enumerate(points):
        t = start + timedelta(seconds=i)
        common = {"candidate_id": first + i, "attempt": 1, "message": "", "metrics": {}, "started_at": t,
                  "ended_at": t + timedelta(seconds=1)}
        if p.ms is None:
            rows.append(common | {"stage": "check", "status": "failed", "failure_kind": "compile"})
            continue
        rows.append(common | {"stage": "check", "status": "passed"})
        rows.append(common | {"stage": "bench", "status": "passed", "ms": p.ms, "baseline_ms": ref,
                              "speedup": ref / p.ms})
    with pop.db.write() as s:
        for i in range(0, len(rows), 20_000):
            s.execute(insert(EvaluationModel), rows[i: i + 20_000])
    pop.recompute_best_speedups()


def synthetic_landscape(family, n: int, seed: int = 11) -> Landscape:
    """n admitted points of `family`, drawn uniformly, each with a made-up time (a fixed
    random cost per parameter value, summed: a landscape a model can learn)."""
    rng = random.Random(seed)
    points = list(family.points())
    cost = {(k, repr(v)): rng.uniform(0.0, 1.0) for k, vs in family.parameters.items() for v in vs}
    return Landscape(name=family.name, parameters=family.parameters, points=[
        Point(params=p, ms=1.0 + sum(cost[(k, repr(v))] for k, v in p.items()))
        for p in rng.sample(points, min(n, len(points)))])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=10_000)
    ap.add_argument("--proposals", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="first proposals shown apart (reads, caches)")
    ap.add_argument("--landscape", type=Path, default=DEFAULT)
    ap.add_argument("--family", type=Path, help="a template family folder instead of a landscape")
    ap.add_argument("--strategies", default="auto,evolution,random")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.family:
        family = load_family(args.family)
        landscape = synthetic_landscape(family, args.candidates)
    else:
        landscape = load_landscape(args.landscape)
        family = landscape.family()
    tmp = Path(tempfile.mkdtemp(prefix="evolve-search-overhead-"))
    pop = Population.open(f"sqlite:///{tmp / 'evolve.db'}")
    wid = pop.ensure_workload("replay", "replay")
    fill(pop, wid, landscape, args.candidates)
    evaluations = len(pop.evaluation_summaries(wid))
    rows = []
    for kind in args.strategies.split(","):
        strategy = make_strategy(StrategyConfig(kind=kind), {family.name: family})
        rng = random.Random(f"0:{kind}")
        tried = {point_key(f, p) for f, p in pop.family_points(wid)}
        state_ms, propose_ms, cpu_ms = [], [], []
        view = SearchView(pop, wid)   # as the loop keeps it: read whole once, then brought up to date
        for i in range(args.proposals):
            c0, t0 = time.process_time(), time.perf_counter()
            state = view.state(tried, i)
            t1 = time.perf_counter()
            proposal = strategy.propose(state, rng)
            t2, c2 = time.perf_counter(), time.process_time()
            state_ms.append((t1 - t0) * 1000)
            propose_ms.append((t2 - t1) * 1000)
            cpu_ms.append((c2 - c0) * 1000)
            if proposal is not None:
                tried.add(proposal.key)
        # The first proposals read the population whole and build the strategy's caches (the
        # seed, then the model's encoded space): a cost per run, not per candidate, shown apart.
        w = min(args.warmup, args.proposals - 1)
        totals = [s + p for s, p in zip(state_ms[w:], propose_ms[w:])]
        rows.append({"strategy": kind, "state_ms": statistics.median(state_ms[w:]),
                     "first_ms": sum(state_ms[:w]) + sum(propose_ms[:w]),
                     "propose_ms": statistics.median(propose_ms[w:]),
                     "total_ms": statistics.median(totals), "mean_ms": statistics.mean(totals),
                     "cpu_ms": statistics.median(cpu_ms[w:])})
    pop.close()
    report = {"landscape": landscape.name, "candidates": args.candidates, "evaluations": evaluations,
              "proposals": args.proposals, "warmup": args.warmup, "cpu_count": os.cpu_count(), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    table = Table(title=f"Per proposal, {args.candidates} candidates ({evaluations} evaluations) of "
                        f"{landscape.name} in SQLite; {args.proposals} proposals, the first {args.warmup} apart")
    for col in ("strategy", "search_state ms", "propose ms", "state + propose ms", "mean ms", "CPU ms",
                f"first {args.warmup} together ms"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        table.add_row(r["strategy"], f"{r['state_ms']:.1f}", f"{r['propose_ms']:.1f}", f"{r['total_ms']:.1f}",
                      f"{r['mean_ms']:.1f}", f"{r['cpu_ms']:.1f}", f"{r['first_ms']:.0f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

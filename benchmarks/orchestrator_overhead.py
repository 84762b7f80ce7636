"""What the orchestrator itself costs per candidate, with no server in the way.

Measures the local steps of one search iteration: proposing a point, rendering it,
registering it and recording stage rows in SQLite, and the local part of the check stage
(static rules, and nvcc where it exists; the import probe runs on the server). Prints a table.

    python benchmarks/orchestrator_overhead.py [--repeat N] [--population N]
"""
from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evolve.config import StrategyConfig  # noqa: E402
from evolve.db import open_database  # noqa: E402
from evolve.families import load_family  # noqa: E402
from evolve.pipeline import nvcc  # noqa: E402
from evolve.pipeline.static_rules import directory_violations, violations  # noqa: E402
from evolve.population import NewCandidate, Population, StageResult  # noqa: E402
from evolve.render import render_candidate  # noqa: E402
from evolve.strategies import EvolutionStrategy, Parent, SearchState, point_key  # noqa: E402

FAMILY = REPO / "evolve" / "templates" / "kda" / "numpy_chunked"


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def row(name: str, samples: list[float]) -> tuple[str, int, float, float, float]:
    samples = sorted(samples)
    p95 = samples[min(len(samples) - 1, int(round(0.95 * (len(samples) - 1))))]
    return name, len(samples), statistics.median(samples), statistics.fmean(samples), p95


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--population", type=int, default=500, help="correct candidates the strategy sees")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="evolve-bench-"))
    rows = []
    try:
        rows.append(row("load + validate family.toml", timed(lambda: load_family(FAMILY), args.repeat)))
        fam = load_family(FAMILY)
        rng = random.Random(0)
        points = list(fam.points())
        rows.append(row("enumerate the space (%d points)" % len(points), timed(lambda: list(fam.points()), 10)))

        pop = Population(open_database(f"sqlite:///{tmp / 'bench.db'}"))
        wid = pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small")
        parents = [Parent(id=i + 1, family=fam.name, params=rng.choice(points), speedup=rng.random() * 3)
                   for i in range(args.population)]
        state = SearchState(correct=parents, tried={point_key(fam.name, fam.defaults)})  # past the seed
        strategy = EvolutionStrategy({fam.name: fam}, StrategyConfig(population_size=16))
        rows.append(row(f"propose (evolution, {args.population} correct)",
                        timed(lambda: strategy.propose(state, rng), args.repeat)))

        gen = tmp / "gen"
        fresh = iter(points * 2)
        rows.append(row("render a new point", timed(lambda: render_candidate(fam, next(fresh), gen / "new"),
                                                    min(args.repeat, len(points)))))
        rows.append(row("render a known point (dedup)",
                        timed(lambda: render_candidate(fam, fam.defaults, gen / "new"), args.repeat)))

        counter = iter(range(10 ** 9))

        def register_and_record() -> None:
            n = next(counter)
            cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=fam.name,
                                                     params=fam.defaults, digest=f"bench{n}",
                                                     directory=f"gen/bench{n}"))
            for stage in ("check", "gputest", "bench"):
                eid = pop.begin_stage(cand.id, stage)
                pop.finish_stage(eid, StageResult(status="passed", ms=1.0, speedup=1.0))

        rows.append(row("add_candidate + 3 stage rows (SQLite)", timed(register_and_record, args.repeat)))
        rows.append(row("correct() over the population", timed(lambda: pop.correct(wid), args.repeat)))

        cand_dir = render_candidate(fam, fam.defaults, gen / "check")
        source = (cand_dir / "solution.py").read_text()
        rows.append(row("static rules on solution.py", timed(lambda: violations(source), args.repeat)))
        rows.append(row("static rules on every file", timed(lambda: directory_violations(cand_dir), args.repeat)))
        if nvcc.nvcc_path():
            cu = tmp / "k.cu"
            cu.write_text('extern "C" __global__ void k(float* x) { __shared__ float s[256];'
                          ' s[threadIdx.x] = x[threadIdx.x]; __syncthreads(); x[threadIdx.x] = s[255 - threadIdx.x]; }\n')
            rows.append(row("nvcc -cubin -Xptxas -v (tiny kernel)",
                            timed(lambda: nvcc.compile_cuda(cu, "sm_90a", [], 120), 5)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    width = max(len(r[0]) for r in rows)
    print(f"{'step'.ljust(width)}  {'n':>4}  {'median ms':>10}  {'mean ms':>10}  {'p95 ms':>10}")
    print(f"{'-' * width}  {'-' * 4}  {'-' * 10}  {'-' * 10}  {'-' * 10}")
    for name, n, med, mean, p95 in rows:
        print(f"{name.ljust(width)}  {n:>4}  {med:>10.3f}  {mean:>10.3f}  {p95:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay search strategies on recorded landscapes: how many evaluations each needs.

Every strategy is driven through the interface `evolve run` uses (`make_strategy`, then
`propose(SearchState, rng)` per free pipeline slot), a proposal's time looked up in the
landscape instead of benchmarked. For each landscape and strategy, over seeds: the median
number of evaluations until a point within `--within` of the optimum, divided by random
search's exact median (sampling without replacement), and the best-so-far curves.

    python benchmarks/search_replay.py                       # every landscape in benchmarks/landscapes
    python benchmarks/search_replay.py L.csv.gz --strategies auto,random --seeds 5 --concurrency 4 \
        --plot replay.svg --json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# One BLAS thread per worker process: the surrogate's matrices are small, and threads
# competing across --jobs processes made proposals several times slower.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from evolve.config import StrategyConfig  # noqa: E402
from evolve.replay.landscape import LandscapeError, load_landscape  # noqa: E402
from evolve.replay.plot import svg_curves  # noqa: E402
from evolve.replay.scoring import geometric_mean, median_evals, random_expected_best, random_median  # noqa: E402
from evolve.replay.simulate import replay  # noqa: E402

LANDSCAPES = REPO / "benchmarks" / "landscapes"
KINDS = ("auto", "model", "evolution", "random", "exhaustive")


def _task(path: str, kind: str, seed: int, budget: int, concurrency: int, stop_ms: float | None) -> dict:
    landscape = load_landscape(path)
    trace = replay(landscape, StrategyConfig(kind=kind, seed=seed), budget=budget, concurrency=concurrency,
                   stop_below_ms=stop_ms)
    return {"path": path, "kind": kind, "seed": seed, "times": trace.times,
            "propose_ms": 1000.0 * trace.propose_s / max(1, trace.proposals)}


def _checkpoints(budget: int) -> list[int]:
    points = sorted({max(1, round(10 ** (i / 20))) for i in range(0, 20 * int(math.log10(budget)) + 21)})
    return [p for p in points if p <= budget] or [1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("landscapes", nargs="*", type=Path, help="landscape files (default: all shipped ones)")
    ap.add_argument("--strategies", default="auto,evolution,random", help=f"comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", type=int, default=2000, help="evaluations per run at most (capped at the space)")
    ap.add_argument("--concurrency", type=int, default=1, help="pipelines in flight (proposals made without "
                                                                  "the results of the others)")
    ap.add_argument("--within", type=float, default=0.05, help="target: this fraction from the optimum")
    ap.add_argument("--full", action="store_true", help="run every budget to the end (full best-so-far curves) "
                                                         "instead of stopping at the target")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    ap.add_argument("--plot", type=Path, help="write the best-so-far curves as SVG here")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.strategies.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        ap.error(f"unknown strategies {bad}; choose from {', '.join(KINDS)}")
    if args.seeds < 1 or args.budget < 1 or args.concurrency < 1 or args.jobs < 1 or not 0 <= args.within < 10:
        ap.error("--seeds, --budget, --concurrency and --jobs must be positive, --within in [0, 10)")
    paths = args.landscapes or sorted(LANDSCAPES.glob("*.csv.gz"))
    if not paths:
        ap.error(f"no landscapes given and none in {LANDSCAPES}")
    console = Console(stderr=True)
    try:
        landscapes = {str(p): load_landscape(p) for p in paths}
    except LandscapeError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2

    tasks = []
    for path, ls in landscapes.items():
        limit = ls.optimum_ms * (1.0 + args.within)
        budget = min(args.budget, len(ls.points))
        for kind in kinds:
            for seed in range(args.seeds):
                tasks.append((path, kind, seed, budget, args.concurrency, None if args.full else limit))
    results: list[dict] = []
    started = time.monotonic()
    with Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress, \
            ProcessPoolExecutor(max_workers=args.jobs) as pool:
        bar = progress.add_task("replay", total=len(tasks))
        # Slow strategies first, so the pool's last minutes are not one long run.
        order = sorted(tasks, key=lambda t: (t[1] == "random", -len(landscapes[t[0]].points)))
        for fut in as_completed([pool.submit(_task, *t) for t in order]):
            results.append(fut.result())
            progress.advance(bar)
            if not console.is_terminal and (len(results) % 10 == 0 or len(results) == len(tasks)):
                # Not a terminal (a log file): a plain line now and then instead of the bar.
                console.print(f"replay: {len(results)}/{len(tasks)} runs done, {time.monotonic() - started:.0f} s")
    wall = time.monotonic() - started

    report = {"settings": {"seeds": args.seeds, "budget": args.budget, "concurrency": args.concurrency,
                           "within": args.within, "strategies": kinds, "wall_s": round(wall, 1)},
              "landscapes": [], "geomean_ratio": {}}
    panels = []
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    for path, ls in landscapes.items():
        limit = ls.optimum_ms * (1.0 + args.within)
        good = ls.within(args.within)
        total = len(ls.points)
        budget = min(args.budget, total)
        rmed = random_median(total, good)
        entry = {"name": ls.name, "path": path, "points": total, "failed": sum(1 for p in ls.points if p.failure),
                 "good": good, "optimum_ms": ls.optimum_ms, "random_exact_median": rmed, "strategies": {}}
        checkpoints = _checkpoints(budget)
        times = ls.times()
        curves = {}
        for kind in kinds:
            runs = sorted((r for r in results if r["path"] == path and r["kind"] == kind), key=lambda r: r["seed"])
            counts = []
            for r in runs:
                hit = next((i for i, t in enumerate(r["times"], 1) if t is not None and t <= limit), None)
                counts.append(hit)
            med = median_evals(counts)
            ratio = med / rmed
            ratios[kind].append(ratio)
            finite = sorted(c for c in counts if c is not None)
            entry["strategies"][kind] = {
                "evals": counts, "median": med if math.isfinite(med) else None, "ratio": ratio if math.isfinite(ratio) else None,
                "p25": _quantile(counts, 0.25), "p75": _quantile(counts, 0.75), "reached": len(finite),
                "propose_ms": statistics.fmean(r["propose_ms"] for r in runs)}
            curve = []
            for c in checkpoints:
                bests = []
                for r in runs:
                    seen = [t for t in r["times"][:c] if t is not None]
                    best = min(seen) if seen else math.inf
                    if not seen and len(r["times"]) < c:
                        best = math.inf
                    bests.append(best / ls.optimum_ms)
                curve.append((c, statistics.median(bests)))
            curves[kind] = curve
        panels.append({"title": f"{ls.name} ({total} points)", "budget": budget, "curves": curves,
                       "target": 1.0 + args.within,
                       "random": [(c, random_expected_best(total, times, c) / ls.optimum_ms) for c in checkpoints]})
        report["landscapes"].append(entry)
    for kind in kinds:
        vals = ratios[kind]
        report["geomean_ratio"][kind] = geometric_mean(vals) if all(math.isfinite(v) for v in vals) else None
    if args.plot:
        args.plot.write_text(svg_curves(panels))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _table(Console(), report, kinds, args.plot)
    return 0


def _quantile(counts: list[int | None], q: float) -> float | None:
    values = sorted(math.inf if c is None else c for c in counts)
    v = values[min(len(values) - 1, int(round(q * (len(values) - 1))))]
    return None if math.isinf(v) else v


def _table(console: Console, report: dict, kinds: list[str], plot: Path | None) -> None:
    s = report["settings"]
    table = Table(title=f"Evaluations to within {s['within']:.0%} of the optimum: median over {s['seeds']} seeds "
                        f"(p25-p75) and its ratio to random search's exact median; budget {s['budget']}, "
                        f"concurrency {s['concurrency']}")
    table.add_column("landscape")
    table.add_column("points (failed)", justify="right")
    table.add_column("within", justify="right")
    table.add_column("random exact", justify="right")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for entry in report["landscapes"]:
        cells = []
        for kind in kinds:
            st = entry["strategies"][kind]
            med = "never" if st["median"] is None else f"{st['median']:g}"
            spread = f"{_fmt(st['p25'])}-{_fmt(st['p75'])}"
            ratio = "-" if st["ratio"] is None else f"{st['ratio']:.2f}"
            cells.append(f"{med} ({spread}) [bold]{ratio}[/]")
        table.add_row(entry["name"], f"{entry['points']} ({entry['failed']})", str(entry["good"]),
                      str(entry["random_exact_median"]), *cells)
    geo = report["geomean_ratio"]
    table.add_row("[bold]geometric mean of ratios[/]", "", "", "1",
                  *[("-" if geo[k] is None else f"[bold]{geo[k]:.3f}[/]") for k in kinds])
    table.add_row("proposal ms (mean)", "", "", "", *[
        f"{statistics.fmean(e['strategies'][k]['propose_ms'] for e in report['landscapes']):.1f}" for k in kinds])
    console.print(table)
    console.print(f"wall time {s['wall_s']} s" + (f"; curves in {plot}" if plot else ""))


def _fmt(v: float | None) -> str:
    return "∞" if v is None else f"{v:g}"


if __name__ == "__main__":
    sys.exit(main())

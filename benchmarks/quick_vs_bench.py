"""How well the gputest stage's quick time foretells the official bench, per candidate.

    python benchmarks/quick_vs_bench.py sqlite:///evolve.db [--workload NAME] [--json]

For every candidate with both a `quick_ms` (gputest with `quick_calls`) and a passed bench
(its first one: confirmations are benches of the same code), prints both times and their
ratio, then the ratios' spread and the rank agreement (Spearman) of the two orderings.
This is the measurement a bench-skipping threshold must come from: skip only where a
candidate's quick time is slower than the best's by more than the ratios ever scatter.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


def pairs(url: str, workload: str | None) -> tuple[list[dict], int]:
    """(quick time beside first bench, per candidate), and how many benches were screened."""
    from evolve.population import Population
    if "://" not in url:
        url = f"sqlite:///{url}"
    pop = Population.open(url)
    try:
        wid = pop.workload_id(workload) if workload else None
        quick: dict[int, float] = {}
        for ev in pop.evaluations_of(wid, stage="gputest", status="passed"):
            q = (ev.metrics or {}).get("quick_ms")
            if isinstance(q, (int, float)) and q > 0:
                quick[ev.candidate_id] = float(q)
        bench: dict[int, float] = {}
        for ev in pop.evaluations_of(wid, stage="bench", status="passed"):
            if ev.ms and ev.candidate_id not in bench:
                bench[ev.candidate_id] = float(ev.ms)
        screened = len({ev.candidate_id for ev in pop.evaluations_of(wid, stage="bench", status="failed")
                        if ev.failure_kind == "screened"})
        out = []
        for cid in sorted(quick.keys() & bench.keys()):
            cand = pop.candidate(cid)
            out.append({"candidate": cid, "family": cand.family if cand else None,
                        "quick_ms": quick[cid], "bench_ms": bench[cid], "ratio": quick[cid] / bench[cid]})
        return out, screened
    finally:
        pop.close()


def spearman(a: list[float], b: list[float]) -> float | None:
    if len(a) < 3:
        return None
    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=xs.__getitem__)
        r = [0.0] * len(xs)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r
    ra, rb = ranks(a), ranks(b)
    return statistics.correlation(ra, rb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", help="the population's URL (or a SQLite file)")
    ap.add_argument("--workload")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows, screened = pairs(args.db, args.workload)
    ratios = [r["ratio"] for r in rows]
    summary = {"pairs": len(rows),
               "ratio_min": min(ratios) if ratios else None, "ratio_median": statistics.median(ratios) if ratios else None,
               "ratio_max": max(ratios) if ratios else None,
               "spearman": spearman([r["quick_ms"] for r in rows], [r["bench_ms"] for r in rows]),
               # Screened candidates have no bench: a run that screened says nothing of the
               # ratios above its threshold. Calibrate on a run with skip_slower_than = 0.
               "screened": screened}
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
        return 0
    console = Console()
    if not rows:
        console.print("no candidate has both a quick time and a passed bench "
                      "(set [stages.gputest] quick_calls in the run's config)")
        return 0
    table = Table(title="gputest quick time against the official bench")
    for col in ("candidate", "family", "quick ms", "bench ms", "quick / bench"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for r in rows:
        table.add_row(str(r["candidate"]), r["family"] or "-", f"{r['quick_ms']:.4f}", f"{r['bench_ms']:.4f}",
                      f"{r['ratio']:.3f}")
    console.print(table)
    rho = summary["spearman"]
    console.print(f"{len(rows)} pairs; quick / bench from {summary['ratio_min']:.3f} to {summary['ratio_max']:.3f} "
                  f"(median {summary['ratio_median']:.3f}); rank agreement "
                  + ("-" if rho is None else f"{rho:.3f}"))
    if screened:
        console.print(f"{screened} candidate(s) were screened and never benched: this run cannot show ratios "
                      "above its threshold (calibrate on a run with skip_slower_than = 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

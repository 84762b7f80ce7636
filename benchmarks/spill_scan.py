"""Which admitted points of a family spill registers: a uniform sample of its admitted points
(optionally only those with given values), each rendered and compiled with ptxas -v for the
target, each distinct kernel source once. Prints every compiled point that spills, then, per
value of each parameter, how many sampled points took it and how many of them spilled: the
figures a constraint against spills would be drawn from. `--json`: one JSON document.

The templates are the project's own, so nvcc runs here unconfined (the check stage confines
a candidate's sources; see evolve/pipeline/nvcc.py). Needs nvcc; no GPU.

    python benchmarks/spill_scan.py --family evolve/templates/kda/two_pass --sample 60 \\
        --where w_gamma=fragments --seed 1
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from evolve.families import Family, load_family  # noqa: E402
from evolve.pipeline.nvcc import gencode, nvcc_path, parse_ptxas  # noqa: E402
from evolve.render import render_candidate  # noqa: E402


def _matches(point: dict, where: dict[str, str]) -> bool:
    return all(str(point[k]) == v for k, v in where.items())


def compile_point(fam: Family, point: dict, scratch: Path, arch: str, seen: dict[str, dict]) -> list[dict]:
    """ptxas figures of each kernel source of one point (sources already compiled are reused)."""
    folder = render_candidate(fam, point, scratch / "gen")
    rows = []
    for src in fam.spec.cuda_sources:
        text = (folder / src).read_bytes()
        key = hashlib.sha256(src.encode() + b"\0" + text).hexdigest()
        if key not in seen:
            res = subprocess.run([nvcc_path() or "nvcc", gencode(arch), "-O3", "-cubin", "-Xptxas", "-v", src,
                                  "-o", str(scratch / "scan.cubin")], cwd=folder, capture_output=True, text=True)
            kernels = parse_ptxas(res.stderr + res.stdout)
            seen[key] = {"ok": res.returncode == 0,
                         "registers": max((k.registers for k in kernels.values()), default=None),
                         "spill_bytes": sum(k.spill_stores + k.spill_loads for k in kernels.values()),
                         "error": "" if res.returncode == 0 else res.stderr[-400:]}
        rows.append({"source": src, **seen[key]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default=str(REPO / "evolve" / "templates" / "kda" / "two_pass"))
    ap.add_argument("--sample", type=int, default=40, help="admitted points to compile (default 40)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--where", action="append", default=[], metavar="NAME=VALUE",
                    help="only points with this value (repeatable)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if nvcc_path() is None:
        print("spill_scan: nvcc is not on PATH", file=sys.stderr)
        return 2
    fam = load_family(args.family)
    where = dict(w.split("=", 1) for w in args.where)
    unknown = set(where) - set(fam.parameters)
    if unknown:
        print(f"spill_scan: {fam.name} has no parameter {sorted(unknown)}", file=sys.stderr)
        return 2
    pool = [p for p in fam.points() if _matches(p, where)]
    random.Random(args.seed).shuffle(pool)
    sample = pool[:args.sample]
    seen: dict[str, dict] = {}
    results = []
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"compiling {len(sample)} of {len(pool)} points", total=len(sample))
        for point in sample:
            results.append({"params": point, "kernels": compile_point(fam, point, Path(tmp), args.arch, seen)})
            progress.advance(task)
    for r in results:
        r["spills"] = any(k["spill_bytes"] or not k["ok"] for k in r["kernels"])
    taken, spilled = Counter(), Counter()
    for r in results:
        for name, value in r["params"].items():
            taken[(name, value)] += 1
            spilled[(name, value)] += r["spills"]
    by_value = [{"parameter": n, "value": v, "sampled": taken[(n, v)], "spilling": spilled[(n, v)]}
                for (n, v) in sorted(taken, key=lambda nv: (list(fam.parameters).index(nv[0]), str(nv[1])))]
    doc = {"family": fam.name, "admitted_matching": len(pool), "sampled": len(results), "where": where,
           "seed": args.seed, "arch": args.arch, "spilling": sum(r["spills"] for r in results),
           "distinct_sources": len(seen), "points": results, "by_value": by_value}
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return 0
    out = Console()
    bad = Table(title=f"{fam.name}: {doc['spilling']} of {len(results)} sampled points spill "
                      f"({len(pool)} admitted match {where or 'everything'})")
    bad.add_column("parameters that differ from the defaults")
    bad.add_column("source")
    bad.add_column("registers", justify="right")
    bad.add_column("spill bytes", justify="right")
    for r in results:
        diff = ", ".join(f"{k}={v}" for k, v in r["params"].items() if fam.defaults.get(k) != v) or "(defaults)"
        for k in r["kernels"]:
            if k["spill_bytes"] or not k["ok"]:
                bad.add_row(diff, k["source"], str(k["registers"]), str(k["spill_bytes"]) if k["ok"] else "failed")
    out.print(bad)
    table = Table(title="sampled and spilling points per value")
    for col in ("parameter", "value", "sampled", "spilling"):
        table.add_column(col, justify="right" if col in ("sampled", "spilling") else "left")
    for row in by_value:
        if len(fam.parameters[row["parameter"]]) > 1:
            table.add_row(row["parameter"], str(row["value"]), str(row["sampled"]), str(row["spilling"]))
    out.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

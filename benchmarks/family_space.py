"""What walking a family's space costs: every admitted point, found depth first with each
constraint checked as soon as the parameters it reads are chosen (`Family.points`), against
filtering the whole product point by point (`--filtered`; what `points` did before, and what
`Family.sample` falls back to when rejection sampling misses). Prints a table (`--json`: JSON).

    python benchmarks/family_space.py [--filtered] [--family evolve/templates/kda/two_pass ...]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from evolve.families import load_family  # noqa: E402

DEFAULT = sorted(str(p.parent) for p in (REPO / "evolve" / "templates").glob("*/*/family.toml"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", help="a family folder (repeatable; default: every family)")
    ap.add_argument("--filtered", action="store_true", help="also time filtering the whole product (slow)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for folder in args.family or DEFAULT:
        fam = load_family(folder)
        t0 = time.perf_counter()
        admitted = list(fam.points())
        row = {"family": fam.name, "product": fam.size_upper_bound(), "admitted": len(admitted),
               "walk_s": time.perf_counter() - t0, "filtered_s": None}
        if args.filtered:
            t0 = time.perf_counter()
            names = list(fam.parameters)
            filtered = [dict(zip(names, c)) for c in itertools.product(*fam.parameters.values())
                        if fam.admits(dict(zip(names, c)))]
            row["filtered_s"] = time.perf_counter() - t0
            assert len(filtered) == len(admitted), (fam.name, len(filtered), len(admitted))
        rows.append(row)
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return 0
    table = Table(title="Walking each family's space: every admitted point")
    for col in ("family", "product", "admitted", "depth-first walk s", "product filtered s"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for r in rows:
        table.add_row(r["family"], f"{r['product']:,}", f"{r['admitted']:,}", f"{r['walk_s']:.2f}",
                      "-" if r["filtered_s"] is None else f"{r['filtered_s']:.2f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`kcoral ncu-metrics`: key metrics of a saved report (.ncu-rep with local ncu, or the
.csv/.json saved beside it)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kcoral.ncu import format_table, load_metrics


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ncu-metrics", help="print the key metrics of a saved report")
    p.add_argument("report", metavar="REPORT", help=".ncu-rep (needs local ncu), .csv or .json")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    metrics = load_metrics(Path(args.report))
    print(metrics.model_dump_json(indent=2) if args.json else format_table(metrics))
    return 0

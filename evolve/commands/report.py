"""`evolve report --out report.html`: a self-contained HTML report of the search (built by
evolve.report; see docs/evolve.md)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from evolve.commands.jsonout import add_json_flag, emit
from evolve.db import DB_HELP, SchemaVersionError
from evolve.population import Population
from evolve.report import render_report


def _run(args: argparse.Namespace) -> int:
    try:
        pop = Population.open(args.db)
        page = render_report(pop, pop.workload_id(args.workload), limit=args.limit)
    except (SchemaVersionError, KeyError) as exc:
        print(f"evolve report: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)  # readers never see a half-written page
    if args.json:
        emit({"out": str(out), "bytes": len(page)})
    else:
        print(f"wrote {out} ({len(page):,} bytes)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="write a self-contained HTML report")
    p.add_argument("--out", default="report.html", help="output file (default: report.html)")
    p.add_argument("--workload", help="only this workload (name or id)")
    p.add_argument("--limit", type=int, default=50, help="leaderboard rows (default 50)")
    p.add_argument("--db", help=DB_HELP)
    add_json_flag(p)
    p.set_defaults(func=_run)

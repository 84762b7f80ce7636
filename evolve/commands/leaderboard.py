"""`evolve leaderboard`: candidates ranked by their best passed bench speedup."""
from __future__ import annotations

import argparse
import sys

from evolve.db import DB_HELP, SchemaVersionError
from evolve.leaderboard_view import format_table, to_json
from evolve.population import Population


def _run(args: argparse.Namespace) -> int:
    try:
        pop = Population.open(args.db)
        rows = pop.leaderboard(workload_id=pop.workload_id(args.workload), limit=args.limit)
    except (SchemaVersionError, KeyError) as exc:
        print(f"evolve leaderboard: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(to_json(rows))
    elif not rows:
        print("no candidate has passed the bench yet")
    else:
        print(format_table(rows))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("leaderboard", help="candidates ranked by best passed bench speedup")
    p.add_argument("--workload", help="only this workload (name or id)")
    p.add_argument("--limit", type=int, default=20, help="rows to show (0: all; default 20)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--db", help=DB_HELP)
    p.set_defaults(func=_run)

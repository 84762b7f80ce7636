"""`evolve leaderboard`: candidates ranked by their best passed bench speedup."""
from __future__ import annotations

import argparse
import sys

from evolve.db import DB_HELP, SchemaVersionError
from evolve.leaderboard_view import cards_note, format_table, on_card, to_json
from evolve.population import Population


def _run(args: argparse.Namespace) -> int:
    try:
        pop = Population.open(args.db)
        workload_id = pop.workload_id(args.workload)
        rows = pop.leaderboard(workload_id=workload_id, limit=args.limit if args.card is None else 0)
    except (SchemaVersionError, KeyError) as exc:
        print(f"evolve leaderboard: {exc}", file=sys.stderr)
        return 2
    if args.card is not None:
        rows = on_card(rows, args.card)[:args.limit or None]
    note = cards_note(rows)
    if note:
        print(f"evolve leaderboard: {note}", file=sys.stderr)
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
    p.add_argument("--card", help="only benches on a card whose name holds this text (e.g. H200), ranked among themselves")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--db", help=DB_HELP)
    p.set_defaults(func=_run)

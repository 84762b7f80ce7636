"""`evolve db upgrade` and `evolve db current`: the database's schema version."""
from __future__ import annotations

import argparse
import sys

from evolve.db import DB_HELP, Database, SchemaVersionError, open_database
from evolve.commands.jsonout import add_json_flag, emit
from evolve.db.migrate import current_revision, head_revision, upgrade


def _database(args: argparse.Namespace) -> Database:
    return open_database(args.db, check_schema=False)


def _upgrade(args: argparse.Namespace) -> int:
    db = _database(args)
    try:
        before, after = upgrade(db, args.revision)
    except SchemaVersionError as exc:
        print(f"evolve db upgrade: {exc}", file=sys.stderr)
        return 2
    finally:
        db.close()
    if args.json:
        emit({"url": str(db.url), "before": before, "after": after})
    elif before == after:
        print(f"{db.url}: already at {after}")
    else:
        print(f"{db.url}: upgraded {before or '(empty)'} -> {after}")
    return 0


def _current(args: argparse.Namespace) -> int:
    db = _database(args)
    try:
        with db.engine.connect() as conn:
            current = current_revision(conn)
    finally:
        db.close()
    head = head_revision()
    if args.json:
        emit({"url": str(db.url), "revision": current, "head": head, "up_to_date": current == head})
        return 0 if current == head else 1
    state = "up to date" if current == head else "run `evolve db upgrade`" if current is None else "differs from this evolve"
    print(f"{db.url}: revision {current or '(none)'}, this evolve: {head} ({state})")
    return 0 if current == head else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("db", help="database schema: upgrade, current")
    sub = p.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = sub.add_parser("upgrade", help="migrate the database to this evolve's schema")
    up.add_argument("--db", help=DB_HELP)
    up.add_argument("--revision", default="head", help="target revision (default: head)")
    add_json_flag(up)
    up.set_defaults(func=_upgrade)
    cur = sub.add_parser("current", help="print the database's schema revision (exit 1 unless current)")
    cur.add_argument("--db", help=DB_HELP)
    add_json_flag(cur)
    cur.set_defaults(func=_current)

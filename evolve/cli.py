"""`evolve` command line: one subcommand per module in `evolve.commands`.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module under evolve.commands
COMMANDS: dict[str, str] = {
    "run": "run",
    "register": "register",
    "evaluate": "evaluate",
    "leaderboard": "leaderboard",
    "show": "show",
    "status": "status",
    "report": "report",
    "db": "db",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evolve", description="Evolutionary search for GPU kernels")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMANDS.values():
        qualified = f"evolve.commands.{module_name}"
        try:
            module = importlib.import_module(qualified)
        except ModuleNotFoundError as exc:
            if exc.name != qualified:  # a missing dependency inside it is a real error
                raise
            continue  # that command is not built yet
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sqlalchemy.exc import DBAPIError

    from evolve.db import UnreadableDatabaseError, default_url
    from evolve.db.integrity import explain

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UnreadableDatabaseError as exc:
        return _database_failure(exc)
    except DBAPIError as exc:
        # Damage found mid-command (after open_database's check) reads the same.
        unreadable = explain(exc, getattr(args, "db", None) or default_url())
        if unreadable is None:
            raise
        return _database_failure(unreadable)


def _database_failure(exc: Exception) -> int:
    print(f"evolve: {exc}", file=sys.stderr)
    return 2  # a bad database, as for a bad config or family


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

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
    "render": "render",
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
    from sqlalchemy.exc import DBAPIError, OperationalError

    from evolve.db import DatabaseUnavailableError, UnreadableDatabaseError, default_url
    from evolve.db.integrity import explain, sqlite_file

    args = build_parser().parse_args(argv)
    url = getattr(args, "db", None) or default_url()
    try:
        return int(args.func(args) or 0)
    except (UnreadableDatabaseError, DatabaseUnavailableError) as exc:
        return _database_failure(exc)
    except DBAPIError as exc:
        # Damage found mid-command (after open_database's check) reads the same.
        unreadable = explain(exc, url)
        if unreadable is not None:
            return _database_failure(unreadable)
        if isinstance(exc, OperationalError) and sqlite_file(url) is None and "://" in url:
            # A database server that is down or refuses us: one line, not a driver traceback.
            reason = next((ln.strip() for ln in str(exc.orig).splitlines() if ln.strip()), type(exc.orig).__name__)
            return _database_failure(DatabaseUnavailableError(f"the database at {_shown(url)} is unreachable: {reason}"))
        raise


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for a message
        return "(the given URL)"


def _database_failure(exc: Exception) -> int:
    from evolve.safe_text import safe_text

    print(f"evolve: {safe_text(str(exc))}", file=sys.stderr)  # may quote a stored candidate value
    return 2  # a bad database, as for a bad config or family


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

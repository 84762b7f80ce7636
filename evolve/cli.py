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
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

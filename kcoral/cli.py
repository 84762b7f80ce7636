"""`kcoral` command line: one subcommand per module in `kcoral.commands`.

Each command module exposes `register(subparsers)` (adds its parser and sets
`func`) so that this file only lists names; modules are imported lazily-cheap.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module under kcoral.commands
COMMANDS: dict[str, str] = {
    "status": "status",
    "python": "python",
    "ncu": "ncu",
    "iket": "iket",
    "iket-analyze": "iket_analyze",
    "ncu-metrics": "ncu_metrics",
    "bench": "bench",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kcoral", description="KCoral client tools")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMANDS.values():
        module = importlib.import_module(f"kcoral.commands.{module_name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Everything after a bare `--` is the remote application's argv, untouched.
    app: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, app = argv[:cut], argv[cut + 1 :]
    # Some tools (ncu) pass their unknown options through to the remote program.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    args.app = app
    code = args.func(args)
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""`kcoral python`: run ``python SCRIPT ARGS`` on the server in the sent directories."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from kcoral.cli import (add_remote_options, add_send_options, echo_run, exit_status,
                        make_client, write_local_files)
from kcoral.progress import Ticker
from kcoral.errors import ToolInputError
from kcoral.remote import SendSpec, parse_env, run_python


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "python", help="run a Python script on the server",
        usage="kcoral python --remote URL --send DIR [-e NAME[=VALUE]]... [--timeout S] "
              "[-o REMOTE_PATH]... [--output-dir D] -- SCRIPT [ARGS]")
    add_remote_options(p)
    add_send_options(p)
    p.add_argument("-o", "--output", action="append", default=[], metavar="REMOTE_PATH",
                   help="file or directory (relative to the run directory) to bring back")
    p.add_argument("--output-dir", default=".", metavar="D",
                   help="where returned files are written (default: .)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.app:
        raise ToolInputError("no script given: kcoral python ... -- SCRIPT [ARGS]")
    sends = [SendSpec.parse(s) for s in args.send]
    env = parse_env(args.env)
    with make_client(args) as client:
        with Ticker(f"{args.app[0]} running on {args.remote}"):
            res = run_python(client, sends, script=args.app[0], args=args.app[1:], env=env,
                             timeout=args.timeout, outputs=args.output)
    echo_run(res)
    for path in write_local_files(args.output_dir, res.files):
        print(f"kcoral: wrote {path}", file=sys.stderr)
    for path in res.missing:
        print(f"kcoral: warning: the remote run produced no {path}", file=sys.stderr)
    for path in res.refused:
        print(f"kcoral: warning: {path} is a link or special file; not returned", file=sys.stderr)
    return exit_status(res)

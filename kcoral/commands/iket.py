"""`kcoral iket`: run an app with in-kernel event tracing; traces come back as Chrome
trace JSON (viewable in Perfetto)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from kcoral.cli import (add_remote_options, add_send_options, echo_run, exit_status,
                        make_client, write_local_files)
from kcoral.progress import Ticker
from kcoral.errors import ToolInputError
from kcoral.remote import SendSpec, parse_env, run_iket


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "iket", help="capture IKET traces of an app on the server",
        usage="kcoral iket --remote URL --send DIR --output-dir DIR [-e ...] -- APP...")
    add_remote_options(p)
    add_send_options(p)
    p.add_argument("--output-dir", required=True, metavar="DIR",
                   help="where the traces (and raw buffers) are written")
    p.add_argument("--no-raw", action="store_true",
                   help="bring back only the traces, not the raw .iket.bin/.iket.json pairs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.app:
        raise ToolInputError("no application given: kcoral iket ... -- APP [ARGS]")
    sends = [SendSpec.parse(s) for s in args.send]
    env = parse_env(args.env)
    with make_client(args) as client:
        with Ticker(f"traced {' '.join(args.app)} on {args.remote}"):
            res = run_iket(client, sends, app=args.app, env=env, timeout=args.timeout,
                           include_raw=not args.no_raw)
    echo_run(res)
    for path in write_local_files(args.output_dir, {**res.raw, **res.traces}):
        print(f"kcoral: wrote {path}", file=sys.stderr)
    for kernel, err in sorted(res.errors.items()):
        print(f"kcoral: {kernel}: not converted: {err}", file=sys.stderr)
    for name in res.unpaired:
        print(f"kcoral: warning: {name} has no partner (.iket.bin needs .iket.json)",
              file=sys.stderr)
    code = exit_status(res)
    if code == 0 and not res.traces:
        print("kcoral: the app wrote no IKET trace (was it built with IKET=1 and did it "
              "write $IKET_OUT/<kernel>.iket.bin and .iket.json?)", file=sys.stderr)
        return 1
    return code

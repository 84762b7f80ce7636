"""`kcoral ncu`: Nsight Compute around an app on the server; the report comes back."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kcoral.cli import add_remote_options, add_send_options, echo_run, exit_status, make_client
from kcoral.ncu import format_table
from kcoral.progress import Ticker
from kcoral.errors import ToolInputError
from kcoral.remote import SendSpec, parse_env, run_ncu


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ncu", help="profile an app with Nsight Compute on the server", allow_abbrev=False,
        usage="kcoral ncu --remote URL --send DIR -o LOCAL.ncu-rep [ncu options] -- APP...")
    add_remote_options(p)
    add_send_options(p)
    p.add_argument("-o", "--output", required=True, metavar="LOCAL.ncu-rep",
                   help="where the report is saved (metrics go to LOCAL.ncu-rep.json)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    # Options this parser does not know are ncu's (e.g. --set full --launch-count 1).
    p.set_defaults(func=run, accepts_extra=True)


def report_path(output: str) -> Path:
    # Like ncu -o: the .ncu-rep suffix is added when missing.
    return Path(output if output.endswith(".ncu-rep") else output + ".ncu-rep")


def run(args: argparse.Namespace) -> int:
    if not args.app:
        raise ToolInputError("no application given: kcoral ncu ... -- APP [ARGS]")
    sends = [SendSpec.parse(s) for s in args.send]
    env = parse_env(args.env)
    out = report_path(args.output)
    with make_client(args) as client:
        with Ticker(f"ncu around {' '.join(args.app)} on {args.remote}"):
            res = run_ncu(client, sends, app=args.app, ncu_args=args.extra, env=env,
                          timeout=args.timeout)
    echo_run(res)
    code = exit_status(res)
    if res.report is None:
        print("kcoral: ncu wrote no report (no kernel matched the filters?)", file=sys.stderr)
        return code or 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(res.report)
    meta = Path(str(out) + ".json")
    meta.write_text(res.metrics.model_dump_json(indent=2) + "\n")
    print(f"kcoral: wrote {out} and {meta}", file=sys.stderr)
    if res.metrics_error:
        print(f"kcoral: metrics not read: {res.metrics_error}", file=sys.stderr)
        if res.import_stderr:
            sys.stderr.write(res.import_stderr)
    print(res.metrics.model_dump_json(indent=2) if args.json else format_table(res.metrics))
    return code

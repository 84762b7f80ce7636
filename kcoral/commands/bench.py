"""`kcoral bench WORKLOAD CANDIDATE`: the official benchmark (holdout, correctness,
timing) of one candidate on the server. Exit 0 iff every check passed."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kcoral.cli import EXIT_TIMEOUT, EXIT_TOOL_FAILURE, EXIT_USAGE, add_remote_options, fail, make_client
from kcoral.progress import Ticker
from kcoral.protocol.error_kind import ErrorKind

EXIT_FAILED = 1  # the candidate failed a check (holdout, correctness, flaky, import, runtime)
# Failures that say nothing about the candidate: the bench could not be carried out.
TOOL_FAILURES = {ErrorKind.TRANSPORT: EXIT_TOOL_FAILURE, ErrorKind.UNAVAILABLE: EXIT_TOOL_FAILURE,
                 ErrorKind.TIMEOUT: EXIT_TIMEOUT}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="official benchmark of a candidate: holdout, correctness, timing",
        usage="kcoral bench WORKLOAD CANDIDATE [--remote URL] [--timeout S] [--json] [--against OTHER]")
    p.add_argument("workload_dir", metavar="WORKLOAD",
                   help="a workload folder (holds workload.json) or a built-in one's name, e.g. forward_b1_t8192_h96")
    p.add_argument("candidate", metavar="CANDIDATE",
                   help="candidate dir, relative to the workload folder (scratch/NAME) or a path")
    add_remote_options(p)
    p.add_argument("--timeout", type=float, default=1500, metavar="S", help="time limit in seconds (default 1500)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON instead of the lines")
    p.add_argument("--against", metavar="OTHER", default=None,
                   help="time OTHER (a candidate) in the baseline slot instead of the baseline")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kcoral.bench import BenchInputError, format_lines, run_bench
    from kcoral.errors import ToolInputError

    if args.timeout <= 0:
        return fail("--timeout must be positive", EXIT_USAGE)
    try:
        with make_client(args) as client:
            with Ticker(f"bench of {args.candidate} running on {args.remote}"):
                rep = run_bench(client, args.workload_dir, args.candidate, timeout=args.timeout, against=args.against)
    except (BenchInputError, ToolInputError) as exc:
        return fail(str(exc), EXIT_USAGE)
    except OSError as exc:  # an unreadable file while staging
        return fail(f"cannot stage the bench: {exc}", EXIT_USAGE)
    if args.json:
        json.dump(rep.model_dump(mode="json"), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        if rep.log.strip() and not rep.passed:
            sys.stderr.write(rep.log if rep.log.endswith("\n") else rep.log + "\n")
        for line in format_lines(rep):
            print(line)
    sys.stdout.flush()
    if rep.passed:
        return 0
    kind = ErrorKind.of(rep.failure_kind or "")
    return TOOL_FAILURES.get(kind, EXIT_FAILED) if isinstance(kind, ErrorKind) else EXIT_FAILED

"""`kcoral baseline-cache DIR [WORKLOAD]`: compile a workload's baseline into DIR, on this
machine, for a server's `--trusted-cache DIR`.

Run by the server's operator, outside any request: it starts the judge's trusted host as a
bench does, with DIR as its compile caches, and calls the baseline (fla's Triton kernels,
compiled and autotuned on the first calls). Each bench's baseline host then starts from a
copy of the cache instead of compiling again. DIR must stay the operator's alone: the
server shows it to requests read-only, and whatever is in it is trusted as the baseline's
own code."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kcoral.cli import EXIT_TOOL_FAILURE, EXIT_USAGE, fail

DEFAULT_WORKLOAD = "forward_b1_t8192_h96"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("baseline-cache", help="compile a workload's baseline for a server's --trusted-cache",
                              usage="kcoral baseline-cache DIR [WORKLOAD] [--json]")
    p.add_argument("directory", metavar="DIR", help="the cache folder (created if missing; give it to kcoral-server "
                                                    "--trusted-cache)")
    p.add_argument("workload_dir", metavar="WORKLOAD", nargs="?", default=DEFAULT_WORKLOAD,
                   help=f"a workload folder or a built-in one's name (default {DEFAULT_WORKLOAD})")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kcoral.bench.staging import BenchInputError, load_workload
    from kcoral.progress import Ticker

    try:
        workload = load_workload(args.workload_dir)
    except BenchInputError as exc:
        return fail(str(exc), EXIT_USAGE)
    cache = Path(args.directory).resolve()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        os.chmod(cache, 0o755)  # readable by the sandbox's request uids, writable by its owner only
    except OSError as exc:
        return fail(f"cannot use {cache}: {exc}", EXIT_USAGE)
    argv = [sys.executable, "-m", "judge.warm", str(workload.root / "workload.json"), str(cache)]
    with Ticker(f"compiling the {workload.name} baseline into {cache}"):
        proc = subprocess.run(argv, cwd=workload.judge_dir.parent, capture_output=True, text=True)
    if proc.returncode != 0:
        return fail(f"the baseline did not run: {proc.stderr.strip()[-3000:] or f'exit status {proc.returncode}'}",
                    EXIT_TOOL_FAILURE)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["directory"] = str(cache)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['baseline']}: {result['triton_files']} Triton files "
              f"({result['triton_bytes'] / 1e6:.1f} MB) in {result['seconds']} s -> {cache}")
        print(f"serve it with: kcoral-server --trusted-cache {cache} ...")
    return 0

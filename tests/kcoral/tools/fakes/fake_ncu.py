"""FAKE Nsight Compute for tests without a GPU: installed as `ncu` in a temporary bin
directory put first on the test server's PATH. It is not a profiler.

- Profiling mode (`ncu [options] APP...`): checks the options like ncu 2025.3 does
  (unknown option -> error; a `derived__` metric in --metrics -> "Failed to find metric",
  as measured on an H200), runs APP, and writes a canned "report" (JSON holding the argv it was
  given) to the --export path. `--kernel-name nomatch` profiles nothing (no report).
- Import mode (`ncu --import R --page raw --csv ...`): prints the canned raw CSV of
  fixtures/ncu_raw_two_launches.csv (two launches), after checking R is its own report;
  without `--metrics`, the whole page: fixtures/ncu_raw_full_page_synthetic.csv, the same
  launches with made-up profile columns (and columns no reader keeps) beside them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

MARKER = "FAKE-NCU-REPORT"
WITH_VALUE = {"--export", "-o", "--metrics", "--clock-control", "--set", "--launch-count",
              "-c", "--launch-skip", "-s", "--kernel-name", "-k", "--section",
              "--target-processes", "--replay-mode", "--kernel-name-base", "--page",
              "--print-units", "--import", "--nvtx-include"}
FLAGS = {"--force-overwrite", "-f", "--csv"}
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "fixtures")
CSV_FIXTURE = os.path.join(FIXTURES, "ncu_raw_two_launches.csv")
FULL_PAGE_FIXTURE = os.path.join(FIXTURES, "ncu_raw_full_page_synthetic.csv")


def parse(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            return opts, argv[i:]
        name, eq, value = a.partition("=")
        if name in FLAGS:
            opts.setdefault(name, []).append("")
            i += 1
        elif name in WITH_VALUE:
            if eq:
                opts.setdefault(name, []).append(value)
                i += 1
            elif i + 1 < len(argv):
                opts.setdefault(name, []).append(argv[i + 1])
                i += 2
            else:
                sys.exit(f"==ERROR== option {name} needs a value")
        else:
            print(f"==ERROR== unrecognised option '{a}'", file=sys.stderr)
            sys.exit(1)
    return opts, []


def main() -> int:
    opts, app = parse(sys.argv[1:])
    if "--import" in opts:
        report = opts["--import"][0]
        with open(report) as fh:
            if json.load(fh).get("marker") != MARKER:
                print("==ERROR== not a report", file=sys.stderr)
                return 1
        with open(CSV_FIXTURE if "--metrics" in opts else FULL_PAGE_FIXTURE) as fh:
            sys.stdout.write(fh.read())
        return 0
    if not app:
        print("==ERROR== no application given", file=sys.stderr)
        return 1
    for metric in ",".join(opts.get("--metrics", [])).split(","):
        if metric.startswith("derived__"):
            print(f"==ERROR== Failed to find metric regex:^{metric}\\.(sum|min|max)$")
            return 9
    print("==PROF== Connected to process (fake ncu)")
    sys.stdout.flush()
    code = subprocess.call(app)
    if opts.get("--kernel-name") == ["nomatch"]:
        print("==WARNING== No kernels were profiled.")
        return code
    export = (opts.get("--export") or opts.get("-o"))[0]
    with open(export, "w") as fh:
        json.dump({"marker": MARKER, "argv": sys.argv[1:], "app": app}, fh)
    print(f"==PROF== Report: {export}")
    return code


if __name__ == "__main__":
    sys.exit(main())

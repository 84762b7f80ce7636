"""Wall time and figures of the official benchmark (`kcoral bench`), run N times.

    python benchmarks/judge_bench.py                      # the CPU twin's reference, local CPU server
    python benchmarks/judge_bench.py --remote URL --workload kcoral/workloads/kda/forward_b1_t8192_h96 \\
        --candidate DIR --repeat 1 --json out.json

Prints one row per bench: wall seconds seen by the client, the judge's own seconds,
kernel and baseline ms, speedup, and which clock the figures came from. To compare two
judges, point --workload at a copy of the workload whose judge/ sits beside it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kcoral import Client  # noqa: E402
from kcoral.bench import run_bench  # noqa: E402
from server_roundtrip import LocalServer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--remote", help="an existing server (default: start a local CPU server)")
    ap.add_argument("--workload", default=str(ROOT / "kcoral/workloads/kda/forward_cpu_small"))
    ap.add_argument("--candidate", default="scratch/reference")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write every report here")
    args = ap.parse_args()
    server = None if args.remote else LocalServer(2, [])
    url = args.remote or server.url
    rows, reports = [], []
    try:
        with Client(url) as client:
            for i in range(args.repeat):
                t0 = time.perf_counter()
                rep = run_bench(client, args.workload, args.candidate, timeout=args.timeout)
                wall = time.perf_counter() - t0
                reports.append(rep.model_dump(mode="json"))
                clock = "n/a" if rep.clock is None else ("judge" if "judge's own clock for" in rep.clock else "host")
                rows.append((i + 1, wall, rep.elapsed_s, rep.kernel_ms, rep.baseline_ms, rep.speedup,
                             clock, "PASS" if rep.passed else f"FAIL {rep.failure_kind}"))
    finally:
        if server is not None:
            server.stop()
    head = ("run", "wall s", "judge s", "kernel ms", "baseline ms", "speedup", "clock", "result")
    print(" | ".join(head))
    for r in rows:
        cells = [str(r[0]), f"{r[1]:.1f}", f"{r[2]:.1f}"] + [f"{x:.4f}" if isinstance(x, float) else "n/a" for x in r[3:6]]
        print(" | ".join(cells + [r[6], r[7]]))
    if len(rows) > 1:
        print(f"median wall {statistics.median(r[1] for r in rows):.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    return 0 if all(r[7] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

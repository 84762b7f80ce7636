"""`evolve run` through the released router (kcoral 0.1.1) on N CPU nodes: evaluations per
hour, and the router's load per evaluation (requests, bytes, time it held them).

    python benchmarks/router_evolve.py --nodes 1 3 [--evals 6] [--workers-per-node 1]

For each node count: starts the pinned router (extracted from the wheel, needs the
[router] extra), N of our CPU servers joined to it as nodes, and one `evolve run` of the
CPU twin (numpy_chunked, chunked matmul points, gputest off, concurrency sized from the
router) to --evals evaluations. Prints one table. On a machine with fewer cores than
nodes the nodes share them, and the figure says so.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.kcoral_server.router.routerproc import RouterProcess, extract_router, our_node  # noqa: E402

CONFIG = """
root = "{repo}"
workload = "kcoral/workloads/kda/forward_cpu_small"
output_dir = "{tmp}/gen"

[[families]]
name = "numpy_chunked"
fixed = {{ algorithm = "chunked", contract = "matmul" }}
subspace = {{ chunk = [8, 16, 32, 64] }}

[strategy]
kind = "evolution"
seed = 1
population_size = 8

[budget]
max_evals = {evals}
hours = 1.0

[stages.check]
timeout = 60
[stages.gputest]
enabled = false
[stages.bench]
timeout = 300

[promotion]
confirm_runs = 1
margin = 0.05

[remote]
concurrency = 0
transport_wait_s = 120
"""


def router_requests(log: str) -> list[dict[str, float]]:
    """The router's `request_finished` lines: bytes in and out, queue wait and duration."""
    out = []
    for line in log.splitlines():
        if "request_finished" not in line:
            continue
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        try:
            out.append({k: float(fields[k].strip('"')) for k in
                        ("request_bytes", "response_bytes", "queue_wait_ms", "duration_ms")})
        except (KeyError, ValueError):
            continue
    return out


def one(binary: Path, nodes: int, workers: int, evals: int, node_args: list[str]) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="kcoral-router-evolve-"))
    router = RouterProcess(binary).start()
    servers = []
    try:
        servers = [our_node(router, f"cpu-{i}", workers=workers, extra=node_args) for i in range(nodes)]
        router.wait_capacity(nodes * workers)
        cfg = tmp / "run.toml"
        cfg.write_text(CONFIG.format(repo=REPO, tmp=tmp, evals=evals))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "evolve.cli", "run", str(cfg), "--remote", router.url,
                               "--db", f"sqlite:///{tmp / 'evolve.db'}", "--json"],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"evolve run failed:\n{proc.stderr[-3000:]}")
        summary = json.loads(proc.stdout[proc.stdout.index("{"):])["summary"]
        reqs = router_requests(router.log_path.read_text(errors="replace"))
    finally:
        for s in servers:
            s.stop()
        router.kill()
    n = max(1, summary["evaluated"])
    return {"nodes": nodes, "slots": nodes * workers, "evaluated": summary["evaluated"], "wall_s": wall,
            "evals_per_hour": summary["evaluated"] / wall * 3600,
            "requests_per_eval": len(reqs) / n,
            "kib_per_eval": sum(r["request_bytes"] + r["response_bytes"] for r in reqs) / n / 1024,
            "router_ms_per_eval": sum(r["duration_ms"] for r in reqs) / n,
            "queue_ms_per_eval": sum(r["queue_wait_ms"] for r in reqs) / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 3], help="node counts to compare (default 1 3)")
    ap.add_argument("--workers-per-node", type=int, default=1)
    ap.add_argument("--evals", type=int, default=6, help="evaluations per run (default 6)")
    ap.add_argument("--router-bin", type=Path, help="a kcoral-router binary (default: from the pinned wheel)")
    ap.add_argument("--sandbox", choices=["bwrap", "none"], help="the nodes' --sandbox (default: theirs)")
    args = ap.parse_args()
    binary = args.router_bin
    if binary is None:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kcoral-evolve-bench"
        binary = extract_router(cache, Path(tempfile.mkdtemp(prefix="kcoral-router-bin-")))
    node_args = ["--sandbox", args.sandbox] if args.sandbox else []
    rows = [one(binary, n, args.workers_per_node, args.evals, node_args) for n in args.nodes]
    print(f"evolve run through kcoral-router 0.1.1, CPU twin, {args.evals} evaluations, "
          f"{os.cpu_count()} cores on this machine, node sandbox {args.sandbox or 'default'}")
    head = ("nodes", "slots", "evaluated", "wall s", "evals/hour", "router req/eval", "KiB/eval",
            "router-held ms/eval", "router queue ms/eval")
    print("  ".join(head))
    for r in rows:
        print("  ".join([f"{r['nodes']:>5}", f"{r['slots']:>5}", f"{r['evaluated']:>9}", f"{r['wall_s']:>6.1f}",
                         f"{r['evals_per_hour']:>10.0f}", f"{r['requests_per_eval']:>15.1f}",
                         f"{r['kib_per_eval']:>8.1f}", f"{r['router_ms_per_eval']:>19.0f}",
                         f"{r['queue_ms_per_eval']:>20.0f}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Round-trip costs of the KCoral server, measured through the real client.

    python benchmarks/server_roundtrip.py                 # starts a local CPU server (2 workers)
    python benchmarks/server_roundtrip.py --sandbox none  # the same without the per-request sandbox
    python benchmarks/server_roundtrip.py --request-memory-bytes 0  # without the memory cgroup per request
    python benchmarks/server_roundtrip.py --remote URL    # an existing server
    python benchmarks/server_roundtrip.py --remote URL --gpu   # adds the GPU section
    python benchmarks/server_roundtrip.py --router        # also through the released router (kcoral 0.1.1)

Prints one table: no-op round trip p50/p99 (targets <= 10 ms / <= 30 ms: every request
gets a fresh sandbox and a fresh worker), no-op programs/s with concurrent clients (target
>= 100/s), the extra cost of re-submitting a cached 64 MiB blob (target <= 10 ms), and with
--gpu: a CuPy kernel timed by builtin.benchmark and the per-program overhead around the
GPU lease (elapsed_ms - lease_held_ms). With --router, the local server also joins the
released `kcoral-router` (extracted from the pinned wheel, needs the [router] extra) and the
latency and throughput rows are measured again through the router, on the same server.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kcoral import Client, Program

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


class LocalServer:
    """`python -m kcoral_server --cpu-workers N` on a free loopback port."""

    def __init__(self, workers: int, extra: list[str]) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="kcoral-bench-", suffix=".log", delete=False)
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kcoral_server", "--port", "0", "--cpu-workers", str(workers), *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
        self.url = ""
        deadline = time.monotonic() + 60
        while not self.url and time.monotonic() < deadline:
            for line in Path(self.log.name).read_text().splitlines():
                if '"listening"' in line:
                    self.url = f"http://127.0.0.1:{json.loads(line)['port']}"
            time.sleep(0.05)
        if not self.url:
            raise SystemExit(f"server did not start:\n{Path(self.log.name).read_text()}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        os.unlink(self.log.name)


def noop_program() -> Program:
    return Program()


def call_program() -> Program:
    p = Program()
    mod = p.upload(kind="module", source="def f():\n    return None\n")
    p.return_(key="r", value=p.run(fn=p.get_function(module=mod, name="f", cpu_only=True)))
    return p


def timed(client: Client, program: Program, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        client.execute(program, timeout_seconds=60).raise_for_failure()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def throughput(url: str, clients: int, seconds: float) -> float:
    done = [0] * clients
    stop = time.monotonic() + seconds

    def go(i: int) -> None:
        with Client(url) as c:
            p = noop_program()
            while time.monotonic() < stop:
                c.execute(p, timeout_seconds=60).raise_for_failure()
                done[i] += 1

    threads = [threading.Thread(target=go, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - t0)


def blob_rows(client: Client, n: int, noop_p50: float) -> list[tuple[str, str, str]]:
    blob = np.random.default_rng(0).bytes(64 << 20)
    lazy = Program()
    lazy.upload(kind="bytes", value=blob)
    used = Program()
    mod = used.upload(kind="module", source="def f(b):\n    return len(b)\n")
    used.return_(key="n", value=used.run(fn=used.get_function(module=mod, name="f"), args=[used.upload(kind="bytes", value=blob)]))
    t = time.perf_counter()
    client.execute(lazy, timeout_seconds=120).raise_for_failure()
    first = (time.perf_counter() - t) * 1e3
    second = statistics.median(timed(client, lazy, n))
    touched = statistics.median(timed(client, used, max(3, n // 4)))
    return [
        ("64 MiB blob, first submission (upload)", f"{first:.1f} ms", "-"),
        ("64 MiB blob, cached re-submission, extra vs no-op", f"{second - noop_p50:.2f} ms", "<= 10 ms"),
        ("64 MiB blob, cached, read by the program (len)", f"{touched:.1f} ms", "-"),
    ]


def gpu_rows(client: Client) -> list[tuple[str, str, str]]:
    n = 1 << 24
    p = Program()
    src = p.upload(kind="module", source=SAXPY, language="cuda")
    kern = p.run(fn="builtin.compile_cuda", args=[src, {"name": "saxpy"}])
    x = p.run(fn="builtin.randn", args=[[n], "float32"])
    y = p.run(fn="builtin.randn", args=[[n], "float32"])
    out = p.run(fn="builtin.zeros", args=[[n], "float32"])
    args = [[(n + 255) // 256], [256], 2.0, x, y, out, n]
    p.return_(key="flush", value=p.run(fn="builtin.benchmark", args=[kern, args, {"flush_l2": True}]))
    p.return_(key="hot", value=p.run(fn="builtin.benchmark", args=[kern, args, {"flush_l2": False}]))
    res = client.execute(p, timeout_seconds=300).raise_for_failure()
    flush, hot = res.results["flush"], res.results["hot"]
    gb = 3 * n * 4 / 1e9
    small = Program()
    small.return_(key="z", value=small.run(fn="builtin.zeros", args=[[1024], "float32"]))
    overheads, held = [], []
    for _ in range(30):
        o = client.execute(small, timeout_seconds=60).raise_for_failure()
        overheads.append(o.elapsed_ms - o.lease_held_ms)
        held.append(o.lease_held_ms)
    return [
        ("saxpy 16M floats, L2 flushed: median", f"{flush['latency_ms_median']:.4f} ms ({gb / flush['latency_ms_median'] * 1e3:.0f} GB/s)", f"{flush['samples']} samples"),
        ("saxpy 16M floats, L2 warm: median", f"{hot['latency_ms_median']:.4f} ms ({gb / hot['latency_ms_median'] * 1e3:.0f} GB/s)", f"{hot['samples']} samples"),
        ("GPU program: lease held (median)", f"{statistics.median(held):.2f} ms", "-"),
        ("GPU program: elapsed - lease_held (median)", f"{statistics.median(overheads):.2f} ms", "-"),
    ]


def start_router() -> tuple[object, str]:
    """The pinned released router on loopback (the tests' helper: same wheel, same cache)."""
    from tests.kcoral_server.router.routerproc import RouterProcess, extract_router
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kcoral-evolve-bench"
    router = RouterProcess(extract_router(cache, Path(tempfile.mkdtemp(prefix="kcoral-router-bin-")))).start()
    return router, router.url


def latency_rows(url: str, n: int, clients: int, label: str) -> tuple[list[tuple[str, str, str]], float]:
    with Client(url) as client:
        timed(client, noop_program(), 20)  # warm-up: connections, imports
        noop = timed(client, noop_program(), n)
        call = timed(client, call_program(), n // 2)
    p50 = statistics.median(noop)
    return [
        (f"{label}no-op round trip p50", f"{p50:.2f} ms", "<= 10 ms"),
        (f"{label}no-op round trip p99", f"{pct(noop, 0.99):.2f} ms", "<= 30 ms"),
        (f"{label}one-function program p50 (upload+get_function+run+return)", f"{statistics.median(call):.2f} ms", "-"),
        (f"{label}no-op programs/s, {clients} clients", f"{throughput(url, clients, 3.0):.0f} /s", ">= 100 /s"),
    ], p50


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--remote", help="server URL (default: start a local CPU server)")
    ap.add_argument("--workers", type=int, default=2, help="CPU workers of the local server")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients for the throughput row")
    ap.add_argument("-n", type=int, default=300, help="sequential round trips for the latency rows")
    ap.add_argument("--gpu", action="store_true", help="add the GPU section (needs a GPU server)")
    ap.add_argument("--no-blob", action="store_true", help="skip the 64 MiB blob rows")
    ap.add_argument("--sandbox", choices=["bwrap", "none"], help="the local server's --sandbox (default: its default)")
    ap.add_argument("--request-memory-bytes", type=int,
                    help="the local server's --request-memory-bytes (0: no memory cgroup per request)")
    ap.add_argument("--router", action="store_true",
                    help="also measure through the released router, the local server joined as its node")
    args = ap.parse_args()
    if args.router and args.remote:
        ap.error("--router joins the local server it starts; it cannot be combined with --remote")
    router, router_url = start_router() if args.router else (None, "")
    extra = ["--sandbox", args.sandbox] if args.sandbox else []
    if args.request_memory_bytes is not None:
        extra += ["--request-memory-bytes", str(args.request_memory_bytes)]
    if router is not None:
        extra += ["--router", router_url, "--node-id", "bench"]
        os.environ["KCORAL_NODE_TOKEN"] = router.token  # type: ignore[attr-defined]  # the local server inherits it
    local = None if args.remote else LocalServer(args.workers, extra)
    url = args.remote or local.url  # type: ignore[union-attr]
    rows: list[tuple[str, str, str]] = []
    try:
        if router is not None:
            router.wait_capacity(args.workers)  # type: ignore[attr-defined]
        label = "direct: " if router is not None else ""
        direct, p50 = latency_rows(url, args.n, args.clients, label)
        rows += direct
        if router is not None:
            rows += latency_rows(router_url, args.n, args.clients, "via router: ")[0]
        with Client(url) as client:
            if not args.no_blob:
                rows += blob_rows(client, 20, p50)
            if args.gpu:
                rows += gpu_rows(client)
            health = client.health()
    finally:
        if local:
            local.stop()
        if router is not None:
            router.kill()  # type: ignore[attr-defined]
    width = max(len(r[0]) for r in rows)
    sandbox = (health.get("sandbox") or {}).get("mode", "-")
    memory = (health.get("sandbox") or {}).get("request_memory")
    cgroup = f"v{memory['version']}, {memory['limit_bytes'] >> 20} MiB" if memory else "none"
    print(f"server {url}  workers={len(health.get('workers', []))}  gpus={health.get('gpu_count')}  sandbox={sandbox}  "
          f"request memory cgroup={cgroup}")
    print(f"{'measure'.ljust(width)}  {'value':>28}  target")
    for name, value, target in rows:
        print(f"{name.ljust(width)}  {value:>28}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

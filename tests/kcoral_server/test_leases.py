"""GPU lease exclusivity, on virtual GPUs (NumPy workers standing in for devices)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kcoral import Client, Program
from tests.serverproc import ServerProcess

# Programs report when they held the GPU in their results (a sandboxed program cannot
# write to the test's files).
RECORDER = (
    "import time\n"
    "def hold(tag, seconds):\n"
    "    start = time.time()\n"
    "    time.sleep(seconds)\n"
    "    return [tag, start, time.time()]\n"
)


@pytest.fixture(scope="module")
def vgpu_server():
    with ServerProcess(["--virtual-gpus", "1", "--workers-per-gpu", "3"]) as srv:
        yield srv


def _program(tag: str, seconds: float, cpu_only: bool = False) -> Program:
    p = Program()
    mod = p.upload(kind="module", source=RECORDER)
    fn = p.get_function(module=mod, name="hold", cpu_only=cpu_only)
    p.return_(key="tag", value=p.run(fn=fn, args=[tag, seconds]))
    return p


def _run_concurrently(url: str, programs: list[Program]) -> list:
    results: list = [None] * len(programs)

    def go(i: int) -> None:
        with Client(url) as c:
            results[i] = c.execute(programs[i], timeout_seconds=60)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(programs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _intervals(outs: list) -> dict[str, tuple[float, float]]:
    return {tag: (a, b) for tag, a, b in (o.results["tag"] for o in outs if o is not None and o.status == "COMPLETED")}


def test_programs_on_one_gpu_never_hold_the_lease_at_once(vgpu_server) -> None:
    outs = _run_concurrently(vgpu_server.url, [_program(f"p{i}", 0.4) for i in range(3)])
    assert all(o.status == "COMPLETED" for o in outs)
    spans = sorted(_intervals(outs).values())
    assert len(spans) == 3
    for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
        assert e1 <= s2, f"lease intervals overlap: {(s1, e1)} and {(s2, e2)}"
    assert all(o.lease_held_ms >= 350 for o in outs)
    assert max(o.lease_wait_ms for o in outs) >= 300  # someone waited for the GPU
    assert all(o.gpu == 0 for o in outs)


def test_cpu_only_run_releases_the_lease(vgpu_server) -> None:
    gpu_prog = _program("gpu", 0.4)
    cpu_prog = Program()
    # The CPU program first takes the lease (tensor upload); its cpu_only run must give it
    # back, so the GPU program (started later) gets the GPU while the cpu_only run sleeps.
    cpu_prog.upload(kind="tensor", value=np.zeros(4, np.float32))
    mod = cpu_prog.upload(kind="module", source=RECORDER)
    fn = cpu_prog.get_function(module=mod, name="hold", cpu_only=True)
    cpu_prog.return_(key="tag", value=cpu_prog.run(fn=fn, args=["cpu", 1.5]))

    outs: list = [None, None]

    def run(i: int, prog: Program, delay: float) -> None:
        time.sleep(delay)
        with Client(vgpu_server.url) as c:
            outs[i] = c.execute(prog, timeout_seconds=60)

    threads = [threading.Thread(target=run, args=(0, gpu_prog, 0.5)), threading.Thread(target=run, args=(1, cpu_prog, 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = _intervals(outs)
    (gs, ge), (cs, ce) = spans["gpu"], spans["cpu"]
    assert cs < ge and gs < ce, "the cpu_only run should have overlapped the GPU holder"
    assert outs[0].status == outs[1].status == "COMPLETED"
    assert outs[1].lease_held_ms < 300  # held only for the tensor upload, then released
    assert outs[0].lease_wait_ms < 300 and outs[0].lease_held_ms >= 350


def test_health_reports_lease_depth_time_held_and_workers(vgpu_server) -> None:
    t = threading.Thread(target=_run_concurrently, args=(vgpu_server.url, [_program(f"h{i}", 0.8) for i in range(2)]))
    t.start()
    depth = 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and depth < 2:
        h = vgpu_server.health()
        depth = max(depth, h["gpus"][0]["lease_depth"])
        time.sleep(0.05)
    t.join()
    h = vgpu_server.health()
    assert depth == 2
    # both programs held the lease for their 0.8 s sleeps, one after the other
    assert 1.6 <= h["gpus"][0]["lease_held_s"] <= h["uptime_seconds"]
    assert h["gpu_count"] == 1 and h["virtual_gpus"] is True
    assert "builtins" in h["extensions"] and "holdout_seeds" in h["extensions"]
    assert [w["gpu_id"] for w in h["workers"]] == [0, 0, 0]
    assert h["gpus"][0]["lease_depth"] == 0


def test_builtins_take_the_lease_on_a_gpu_worker(vgpu_server) -> None:
    p = Program()
    z = p.run(fn="builtin.randn", args=[[8], "float32"])
    p.return_(key="z", value=z)
    with Client(vgpu_server.url) as c:
        out = c.execute(p, timeout_seconds=30).raise_for_failure()
    assert out.results["z"].shape == (8,)
    assert out.lease_held_ms > 0

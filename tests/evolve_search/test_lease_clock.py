"""The run's GPU-busy figure comes from the lease time the server counts: measured here
against a real server process on virtual GPUs, and across a server restart."""
from __future__ import annotations

import time

from kcoral import Client, Program
from evolve.leaseclock import LeaseClock
from tests.serverproc import ServerProcess

HOLD = "import time\ndef hold(seconds):\n    time.sleep(seconds)\n    return seconds\n"


def _hold(url: str, seconds: float) -> None:
    p = Program()
    fn = p.get_function(module=p.upload(kind="module", source=HOLD), name="hold")
    p.return_(key="s", value=p.run(fn=fn, args=[seconds]))
    with Client(url) as c:
        c.execute(p, timeout_seconds=60).raise_for_failure()


def test_fraction_follows_the_servers_lease_time():
    with ServerProcess(["--virtual-gpus", "1"]) as srv, Client(srv.url) as client:
        clock = LeaseClock(client.health)
        clock.start()
        _hold(srv.url, 1.0)
        held = clock.sample()
        wall = time.monotonic() - clock.started_at
        assert held is not None and clock.gpu_count == 1
        # one second of lease inside `wall` seconds, give or take the program's set-up
        assert 0.9 / wall <= held <= 1.0
        time.sleep(1.0)
        assert clock.sample() < held   # idle time dilutes it


def test_cpu_server_reports_no_gpu_fraction():
    with ServerProcess(["--cpu-workers", "1"]) as srv, Client(srv.url) as client:
        clock = LeaseClock(client.health)
        clock.start()
        assert clock.sample() is None


def test_a_restarted_server_keeps_the_lease_time_before_the_restart():
    answers = iter([
        {"instance_id": "a", "gpus": [{"lease_held_s": 100.0}]},   # leased before the run: not counted
        {"instance_id": "a", "gpus": [{"lease_held_s": 103.0}]},
        {"instance_id": "b", "gpus": [{"lease_held_s": 2.0}]},     # restarted: counts from zero
    ])
    clock = LeaseClock(lambda: next(answers))
    clock.start()
    clock.started_at -= 10.0
    assert abs(clock.sample() - 0.3) < 0.01
    assert abs(clock.sample() - 0.5) < 0.01
    clock._health = lambda: (_ for _ in ()).throw(OSError("connection refused"))
    assert abs(clock.sample() - 0.5) < 0.01   # unreachable: the last figure stands


def test_older_servers_without_lease_time_fall_back():
    clock = LeaseClock(lambda: {"instance_id": "x", "gpus": [{"gpu_id": 0, "lease_depth": 0}]})
    clock.start()
    assert clock.sample() is None and not clock.supported

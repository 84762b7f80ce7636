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
        clock = LeaseClock(lambda: client.health(retry=False, timeout_s=2.0), min_interval_s=0.0)
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
        clock = LeaseClock(client.health, min_interval_s=0.0)
        clock.start()
        assert clock.sample() is None


class _Clock:
    """A hand-moved monotonic clock, so the fractions below are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _scripted(monkeypatch, answers):
    clock_time = _Clock()
    monkeypatch.setattr("evolve.leaseclock.time.monotonic", clock_time)
    replies = iter(answers)

    def health():
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    return clock_time, health


def test_a_restarted_server_keeps_the_lease_time_before_the_restart(monkeypatch):
    t, health = _scripted(monkeypatch, [
        {"instance_id": "a", "gpus": [{"lease_held_s": 100.0}]},   # leased before the run: not counted
        {"instance_id": "a", "gpus": [{"lease_held_s": 103.0}]},
        {"instance_id": "b", "gpus": [{"lease_held_s": 2.0}]},     # restarted: counts from zero
        OSError("connection refused"),                              # unreachable: the last figure stands
    ])
    clock = LeaseClock(health, min_interval_s=0.0)
    clock.start()
    t.now += 10.0
    assert clock.sample() == 0.3
    assert clock.sample() == 0.5
    assert clock.sample() == 0.5


def test_a_restart_without_instance_ids_is_seen_by_the_counter_going_back(monkeypatch):
    t, health = _scripted(monkeypatch, [
        {"gpus": [{"lease_held_s": 50.0}, {"lease_held_s": 50.0}]},
        {"gpus": [{"lease_held_s": 54.0}, {"lease_held_s": 52.0}]},
        {"gpus": [{"lease_held_s": 1.0}, {"lease_held_s": 1.0}]},
    ])
    clock = LeaseClock(health, min_interval_s=0.0)
    clock.start()
    t.now += 10.0
    assert clock.sample() == 6.0 / 20.0       # two GPUs: per-GPU fraction
    assert clock.sample() == 8.0 / 20.0


def test_samples_are_rate_limited(monkeypatch):
    t, health = _scripted(monkeypatch, [
        {"instance_id": "a", "gpus": [{"lease_held_s": 0.0}]},
        {"instance_id": "a", "gpus": [{"lease_held_s": 4.0}]},
    ])
    clock = LeaseClock(health, min_interval_s=5.0)
    clock.start()
    t.now += 8.0
    assert clock.sample() == 0.5              # the first poll (the scripted health has one more answer)
    t.now += 2.0
    assert clock.sample() == 0.4              # within 5 s: no poll, the figure just dilutes


def test_older_servers_without_lease_time_fall_back():
    clock = LeaseClock(lambda: {"instance_id": "x", "gpus": [{"gpu_id": 0, "lease_depth": 0}]})
    clock.start()
    assert clock.sample() is None and not clock.supported

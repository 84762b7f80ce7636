from __future__ import annotations

import io

from evolve.loop import server_concurrency
from evolve.pipeline import RunStats
from evolve.pipeline.errors import TransportTrouble, failure_kind, is_transport_error
from evolve.promotion import decide
from evolve.population import StageResult
from evolve.run_progress import Progress
from kcoral import RemoteError, TransportError


def test_concurrency_follows_the_servers_workers():
    gpu = {"gpu_count": 2, "workers": [{"worker_id": f"gpu{i}/w{j}", "gpu_id": i} for i in (0, 1) for j in (0, 1)]}
    assert server_concurrency(gpu) == 4
    assert server_concurrency({"gpu_count": 0, "workers": [{"worker_id": "cpu/w0", "gpu_id": None}] * 3}) == 3
    assert server_concurrency({"gpu_count": 1}) == 1


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_on_a_tty_and_prints_lines_otherwise():
    stats = RunStats()
    stats.evaluated, stats.in_flight, stats.best_ms, stats.best_speedup = 5, 2, 1.25, 2.0
    stats.failures["correctness"] += 2
    stats.lease_held_ms = 0.0
    tty, plain = _Tty(), io.StringIO()
    for stream in (tty, plain):
        p = Progress(stream, gpu_slots=1, interval_s=0.0, has_gpu=True)
        p.update(stats, force=True)
        p.update(stats, force=True)
        p.close(stats)
    assert tty.getvalue().count("\r") == 3 and tty.getvalue().endswith("\n")
    assert plain.getvalue().count("\n") == 3 and "\r" not in plain.getvalue()
    line = plain.getvalue().splitlines()[0]
    assert "evaluated 5" in line and "in flight 2" in line and "correctness=2" in line
    assert "1.2500 ms 2.000x" in line and "gpu busy 0%" in line


def test_before_any_promotion_the_line_shows_the_benches_and_the_fastest_unconfirmed():
    # On one GPU a pipeline takes minutes (an H200 run showed "evaluated 0 ... best -" for
    # seven minutes while three benches had passed): the benches are the news until then.
    stats = RunStats()
    stats.in_flight = 3
    for ms, speedup in ((0.9198, 2.864), (0.8380, 3.147), (1.469, 1.795)):
        stats.add_bench(ms, speedup)
    plain = io.StringIO()
    Progress(plain, gpu_slots=1, interval_s=0.0, has_gpu=True).update(stats, force=True)
    line = plain.getvalue()
    assert "evaluated 0" in line and "benched 3" in line and "0.8380 ms 3.147x unconfirmed" in line
    # once a promotion is read back, the confirmed figure replaces it
    stats.best_ms, stats.best_speedup = 0.8380, 3.147
    plain = io.StringIO()
    Progress(plain, gpu_slots=1, interval_s=0.0, has_gpu=True).update(stats, force=True)
    assert "best 0.8380 ms 3.147x" in plain.getvalue() and "unconfirmed" not in plain.getvalue()


def test_transport_trouble_is_told_apart():
    assert is_transport_error(TransportError("connection refused"))
    assert is_transport_error(RemoteError("busy", "queue full", status_code=503))
    assert is_transport_error(TransportTrouble("transport: reset"))
    assert not is_transport_error(RemoteError("runtime", "boom"))
    assert failure_kind(RemoteError("timeout", "slow", status_code=504)) == "timeout"
    assert failure_kind(RemoteError("gpu_access", "poisoned")) == "resources"
    assert failure_kind(ValueError("x")) == "runtime"


def _run(speedup, spread=0.1, ok=True):
    return StageResult(status="passed", speedup=speedup, spread=spread) if ok else \
        StageResult(status="failed", failure_kind="flaky", message="flaky")


def test_promotion_rule():
    assert decide([_run(1.5), _run(1.4)], has_best=True, margin=0.05)[0]
    assert not decide([_run(1.5), _run(0.99)], has_best=True, margin=0.05)[0]        # lost one run
    assert not decide([_run(1.12, 0.1), _run(1.12, 0.1)], has_best=True, margin=0.05)[0]  # within noise
    assert not decide([_run(2.0), _run(2.0, ok=False)], has_best=True, margin=0.0)[0]
    assert decide([_run(0.5), _run(0.6)], has_best=False, margin=0.05)[0]             # first correct


def test_the_tty_line_fits_an_80_column_terminal():
    from rich.console import Console

    stats = RunStats()
    stats.evaluated, stats.in_flight, stats.best_ms, stats.best_speedup, stats.promotions = 1234, 3, 1.2493, 2.114, 7
    for kind, n in (("correctness", 41), ("runtime", 12), ("timeout", 3), ("compile", 9)):
        stats.failures[kind] += n
    tty = _Tty()
    console = Console(file=tty, width=80, force_terminal=True, color_system=None)
    p = Progress(tty, gpu_slots=1, interval_s=0.0, has_gpu=True, console=console)
    p.gpu_busy = 0.97
    p.update(stats, force=True)
    p.update(stats, force=True)
    drawn = [seg.split("\x1b[K")[0] for seg in tty.getvalue().split("\r") if seg]
    assert len(drawn) == 2
    for line in drawn:
        # a line as wide as the terminal wraps on some terminals: one column is kept free
        assert len(line) < 80, (len(line), line)
        assert "1234" in line and "2.114x" in line and "97%" in line

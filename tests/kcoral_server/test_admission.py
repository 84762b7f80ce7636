"""Queue bound (503 busy + Retry-After) and graceful drain on SIGTERM."""
from __future__ import annotations

import threading
import time


from kcoral import Client
from tests.serverproc import ServerProcess

from .helpers import function_program, post_program

SLEEPER = "import time\ndef main(s):\n    time.sleep(s)\n    return s\n"


def _background(url: str, seconds: float, out: list, index: int) -> threading.Thread:
    def go() -> None:
        with Client(url, retries=1) as c:
            try:
                out[index] = c.execute(function_program(SLEEPER, args=[seconds]), timeout_seconds=30)
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                out[index] = exc

    t = threading.Thread(target=go)
    t.start()
    return t


def _wait_for(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def test_queue_bound_and_queue_timeout_answer_503() -> None:
    with ServerProcess(["--cpu-workers", "1", "--max-queue", "1", "--queue-timeout", "1"]) as srv:
        out: list = [None, None]
        t1 = _background(srv.url, 2.5, out, 0)
        _wait_for(lambda: srv.health()["workers"][0]["status"] == "busy")
        t2 = _background(srv.url, 0.1, out, 1)  # waits in the queue, gives up after 1 s
        _wait_for(lambda: srv.health()["queue_length"] == 1)
        r = post_program(srv.url, function_program(SLEEPER, args=[0]).to_dict())
        assert r.status_code == 503 and r.json()["error"]["kind"] == "busy"
        assert int(r.headers["Retry-After"]) >= 1
        t2.join()
        assert getattr(out[1], "kind", None) == "busy" and out[1].status_code == 503
        t1.join()
        assert out[0].status == "COMPLETED"


def test_sigterm_drains_in_flight_work_then_exits_zero() -> None:
    srv = ServerProcess(["--cpu-workers", "1"]).start()
    try:
        out: list = [None]
        t = _background(srv.url, 1.5, out, 0)
        _wait_for(lambda: srv.health()["active_requests"] == 1)
        srv.proc.send_signal(15)
        _wait_for(lambda: srv.health()["status"] == "draining", timeout=5)
        r = post_program(srv.url, function_program(SLEEPER, args=[0]).to_dict())
        assert r.status_code == 503 and r.json()["error"]["kind"] == "busy"
        t.join()
        assert out[0].status == "COMPLETED" and out[0].results["out"] == 1.5
        assert srv.proc.wait(20) == 0
    finally:
        srv.stop()
    assert any(e.get("event") == "server_stopped" for e in srv.events())

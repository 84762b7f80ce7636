"""A client that disconnects mid-program cancels it: the worker and its sandbox die, the
GPU lease is released, and an idempotent retry runs the program again."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import httpx
import pytest

from kcoral import Cancelled, Client
from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.strict_json import dumps
from tests.serverproc import REPO_ROOT, ServerProcess

from .helpers import assert_gone_then_kill, function_program, processes_with_argv, unique_sleep

SLEEPER = (
    "import subprocess\n"
    "def main(secs):\n"
    "    subprocess.run(['sleep', secs])\n"
    "    return 'slept'\n"
)
QUICK = "def main():\n    return 'quick'\n"


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--virtual-gpus", "1", "--workers-per-gpu", "1"]) as srv:
        yield srv


def _post_and_drop(url: str, program: dict[str, Any], after: float, key: str | None = None) -> None:
    """Post a program and close the connection after `after` seconds without an answer."""
    ctype, chunks = encode_multipart([("program", "application/json", dumps(program))])
    headers = {"Content-Type": ctype, **({"Idempotency-Key": key} if key else {})}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/execute", content=b"".join(chunks), headers=headers,
                   timeout=httpx.Timeout(10.0, read=after))


def _wait_for(cond: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _sleeper(secs: str) -> dict[str, Any]:
    # The lease is taken by the (non-cpu_only) run, so the program holds the virtual GPU.
    return function_program(SLEEPER, args=[secs]).to_dict({"timeout_seconds": 60})


def test_disconnect_kills_the_program_and_releases_the_lease(server) -> None:
    secs = unique_sleep()
    _post_and_drop(server.url, _sleeper(secs), after=1.0)
    t0 = time.monotonic()
    assert_gone_then_kill(("sleep", secs), within=3, why="the program outlived its client by 3 s")
    assert _wait_for(lambda: server.health()["gpus"][0]["lease_depth"] == 0, 3 - (time.monotonic() - t0))
    # The slot's next worker serves a new program at once (not after the old one's 60 s).
    t1 = time.monotonic()
    with Client(server.url) as c:
        out = c.execute(function_program(QUICK), timeout_seconds=20).raise_for_failure()
    assert out.results["out"] == "quick" and time.monotonic() - t1 < 10
    assert _wait_for(lambda: any(e.get("status") == "CANCELLED" for e in server.request_logs()), 5)
    assert _wait_for(lambda: all(w["status"] == "idle" for w in server.health()["workers"]), 5)


def test_retry_after_a_cancel_runs_the_program_again(server) -> None:
    secs = unique_sleep()
    program = _sleeper(secs)
    _post_and_drop(server.url, program, after=1.0, key="cancel-retry-1")
    assert_gone_then_kill(("sleep", secs), within=3, why="the program outlived its client by 3 s")
    # The retry is neither blocked by the cancelled claim nor answered from it: it runs anew.
    _post_and_drop(server.url, program, after=1.0, key="cancel-retry-1")
    assert processes_with_argv("sleep", secs), "the retry did not run the program again"
    assert_gone_then_kill(("sleep", secs), within=3, why="the retry's program outlived its client")


def test_abort_from_another_thread_cancels_the_call_and_the_program(server) -> None:
    secs = unique_sleep()
    errors: list[BaseException] = []
    client = Client(server.url)

    def call() -> None:
        try:
            client.execute(function_program(SLEEPER, args=[secs]), timeout_seconds=60)
        except BaseException as exc:  # noqa: BLE001 - recorded for the test
            errors.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    assert _wait_for(lambda: bool(processes_with_argv("sleep", secs)), 10)
    client.abort()
    worker.join(2)
    assert not worker.is_alive(), "abort() did not end the blocked call"
    assert len(errors) == 1 and isinstance(errors[0], Cancelled), errors
    assert_gone_then_kill(("sleep", secs), within=3, why="the program outlived the aborted call")
    client.close()


def test_ctrl_c_of_kcoral_python_ends_promptly_and_cancels(server, tmp_path) -> None:
    secs = unique_sleep()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "go.py").write_text(f"import subprocess\nsubprocess.run(['sleep', '{secs}'])\n")
    env = {**os.environ, "KCORAL_REMOTE": server.url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))}
    # SIGINT at its default in the client, as in a terminal: a test run started in the
    # background of a non-interactive shell inherits it ignored, and Python then never
    # raises KeyboardInterrupt (that, not the client, failed this test in such runs).
    proc = subprocess.Popen([sys.executable, "-m", "kcoral", "python", "--send", "job", "--", "go.py"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert _wait_for(lambda: bool(processes_with_argv("sleep", secs)), 15)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=3)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
    assert_gone_then_kill(("sleep", secs), within=3, why="the program outlived kcoral python's Ctrl-C")

"""Timeouts and crashes: the request's sandbox dies with every process in it, a fresh worker takes its place."""
from __future__ import annotations

import time

import pytest

from kcoral import Client, Program, RemoteError
from tests.serverproc import ServerProcess

from .helpers import function_program, processes_with_argv, unique_sleep


@pytest.fixture(scope="module")
def one_worker():
    with ServerProcess(["--cpu-workers", "1"]) as srv:
        yield srv


def test_sleeping_program_times_out_and_its_children_die(one_worker) -> None:
    marker = unique_sleep()
    src = (
        "import subprocess, time\n"
        "def main(marker):\n"
        "    child = subprocess.Popen(['sleep', marker])\n"
        "    time.sleep(300)\n"
    )
    client = Client(one_worker.url)
    before = {w["worker_id"]: w["pid"] for w in one_worker.health()["workers"]}
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as info:
        client.execute(function_program(src, args=[marker]), timeout_seconds=4)
    assert info.value.kind == "timeout" and info.value.status_code == 504
    assert time.monotonic() - t0 < 20
    deadline = time.monotonic() + 5
    while processes_with_argv("sleep", marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_with_argv("sleep", marker), "the program's subprocess survived the timeout"
    # The next request runs on a replaced worker.
    out = client.execute(function_program("def main():\n    return 'alive'\n"), timeout_seconds=30)
    assert out.results["out"] == "alive"
    after = {w["worker_id"]: w["pid"] for w in one_worker.health()["workers"]}
    assert after.keys() == before.keys() and after != before


@pytest.mark.parametrize("crash", [
    "import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)",
    "import ctypes\n    ctypes.string_at(0)",
    "import os\n    os._exit(3)",
])
def test_crashing_program_fails_with_index_and_next_request_works(one_worker, crash: str) -> None:
    client = Client(one_worker.url)
    p = Program()
    mod = p.upload(kind="module", source=f"def ok():\n    return 'saved'\ndef boom():\n    print('about to crash', flush=True)\n    {crash}\n")
    p.return_(key="early", value=p.run(fn=p.get_function(module=mod, name="ok")))
    p.run(fn=p.get_function(module=mod, name="boom"))
    res = client.execute(p, timeout_seconds=30)
    assert res.status == "FAILED"
    assert res.error.kind == "runtime"
    assert res.error.instruction_index == 5 and res.error.instruction_op == "run"
    assert "worker process" in res.error.message
    assert res.results == {"early": "saved"}
    assert "about to crash" in res.stdout
    out = client.execute(function_program("def main():\n    return 7\n"), timeout_seconds=30)
    assert out.results["out"] == 7

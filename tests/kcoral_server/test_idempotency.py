"""Idempotency-Key: a retry gets the first outcome and never reruns the program."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from kcoral import Client, Program
from kcoral.client import _split_response
from tests.serverproc import ServerProcess

from .helpers import function_program, post_program

# Each run returns a fresh random token: equal tokens mean one run (a sandboxed program
# cannot count its runs in the test's files).
RUN_TOKEN = (
    "import os, time\n"
    "def main(tag, sleep):\n"
    "    time.sleep(sleep)\n"
    "    return os.urandom(8).hex()\n"
)


def token_program(tag: str = "", sleep: float = 0.0) -> Program:
    return function_program(RUN_TOKEN, args=[tag, sleep])


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def server(state_dir):
    with ServerProcess(["--cpu-workers", "2", "--state-dir", str(state_dir)]) as srv:
        yield srv


def test_retry_with_same_key_does_not_rerun(server) -> None:
    with Client(server.url) as c:
        a = c.execute(token_program(), timeout_seconds=30, idempotency_key="key-a")
        b = c.execute(token_program(), timeout_seconds=30, idempotency_key="key-a")
        fresh = c.execute(token_program(), timeout_seconds=30, idempotency_key="key-b")
    assert a.results["out"] == b.results["out"]
    assert a.request_id == b.request_id
    assert fresh.results["out"] != a.results["out"]
    deadline = time.monotonic() + 5  # log lines are written in batches
    while not any(e.get("replay") for e in server.request_logs()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(e.get("replay") for e in server.request_logs())


def test_retry_after_dropped_connection_waits_for_the_running_attempt(server) -> None:
    p = token_program("dropped", sleep=1.5)
    prog = p.to_dict({"timeout_seconds": 30})
    headers = {"Idempotency-Key": "dropped-1"}
    with pytest.raises(httpx.ReadTimeout):
        post_timeout = httpx.Timeout(5.0, read=0.3)
        from kcoral.protocol.multipart import encode_multipart
        from kcoral.protocol.strict_json import dumps

        ctype, chunks = encode_multipart([("program", "application/json", dumps(prog))])
        httpx.post(f"{server.url}/execute", content=b"".join(chunks), headers={**headers, "Content-Type": ctype}, timeout=post_timeout)
    r = post_program(server.url, prog, headers=headers)
    result, _ = _split_response(r)
    assert result["status"] == "COMPLETED", result
    # The answer is the dropped attempt's (its request id); the retry itself was a replay.
    rid = result["request_id"]
    deadline = time.monotonic() + 5  # log lines are written in batches
    while time.monotonic() < deadline:
        logs = server.request_logs()
        if any(e.get("replay") and e["request_id"] != rid for e in logs) and any(e["request_id"] == rid for e in logs):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the retry was not answered with the dropped attempt's outcome")


def test_concurrent_retries_share_one_run(server) -> None:
    outs: list = [None, None, None]

    def go(i: int) -> None:
        with Client(server.url) as c:
            outs[i] = c.execute(token_program(sleep=0.5), timeout_seconds=30, idempotency_key="conc-1")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({o.results["out"] for o in outs}) == 1
    assert len({o.request_id for o in outs}) == 1


def test_same_key_for_a_different_program_is_refused(server) -> None:
    with Client(server.url) as c:
        c.execute(token_program("c1"), timeout_seconds=30, idempotency_key="reuse-1")
    r = post_program(server.url, token_program("c2").to_dict(), headers={"Idempotency-Key": "reuse-1"})
    assert r.status_code == 400 and "different program" in r.json()["error"]["message"]


def test_outcome_survives_a_server_restart(server, state_dir) -> None:
    seeds = Program()
    seeds.return_(key="s", value=seeds.run(fn="builtin.holdout_seeds", args=["restart", 3]))
    with Client(server.url) as c:
        a = c.execute(token_program(), timeout_seconds=30, idempotency_key="restart-1")
        seeds_first = c.execute(seeds, timeout_seconds=30).raise_for_failure().results["s"]
    salt_first = (state_dir / "holdout_salt").read_bytes()
    # A new server process on the same state dir (as after a restart) replays the outcome.
    with ServerProcess(["--cpu-workers", "1", "--state-dir", str(state_dir)]) as second:
        assert second.instance_id != server.instance_id
        with Client(second.url) as c:
            b = c.execute(token_program(), timeout_seconds=30, idempotency_key="restart-1")
            seeds_second = c.execute(seeds, timeout_seconds=30).raise_for_failure().results["s"]
    # The salt persisted (its file is reused); the seeds differ, each call having its own nonce.
    assert (state_dir / "holdout_salt").read_bytes() == salt_first
    assert len(set(seeds_first)) == len(set(seeds_second)) == 3 and seeds_first != seeds_second
    assert a.results["out"] == b.results["out"] and a.request_id == b.request_id
    # The same state dir also kept the generated holdout salt (private file).
    salt = state_dir / "holdout_salt"
    assert salt.exists() and (salt.stat().st_mode & 0o777) == 0o600

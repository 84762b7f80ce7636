"""Resource exhaustion found by the red team, against a real server on loopback: frames a
program forges on its worker's channel, holdout-seed floods, oversized programs, bodies
held by queued requests, and connections that never finish their request head."""
from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serverproc import ServerProcess

from .helpers import function_program, post_program, sha

MiB = 1 << 20
RESPONSE_LIMIT = MiB

# Program code finds its worker's Executor, and with it the channel to the server.
EXECUTOR = ("import gc, json, struct, time\n"
            "def executor():\n"
            "    return next(o for o in gc.get_objects() if type(o).__name__ == 'Executor')\n")


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) << 10
    return out


def _pid(srv: ServerProcess) -> int:
    assert srv.proc is not None
    return srv.proc.pid


def _run(srv: ServerProcess, source: str, args: list[Any] | None = None, timeout: float = 30) -> httpx.Response:
    program = function_program(EXECUTOR + source, args=args).to_dict({"timeout_seconds": timeout})
    return post_program(srv.url, program)


@pytest.fixture(scope="module")
def limits_server() -> Iterator[ServerProcess]:
    """One worker (so that requests queue) and a 1 MiB response limit."""
    with ServerProcess(["--cpu-workers", "1", "--max-response-bytes", str(RESPONSE_LIMIT)]) as srv:
        yield srv


# ---------------------------------------------------------------------- the worker channel
def test_a_forged_oversized_header_is_refused_unread() -> None:
    # An 8 MB header of empty lists, parsed in the event loop, once cost the server ~220 MB
    # (30 MB: 800 MB, and /health stalled for 3 s); a step frame may not be that large.
    src = ("def main(size):\n"
           "    body = '[' + ','.join(['[]'] * (size // 3)) + ']'\n"
           "    raw = ('{\"t\":\"step\",\"i\":0,\"x\":' + body + ',\"bin\":[]}').encode()\n"
           "    executor().chan.sock.sendall(struct.pack('>I', len(raw)) + raw)\n"
           "    time.sleep(2)\n"
           "    return 'sent'\n")
    with ServerProcess(["--cpu-workers", "1"]) as srv:
        before = _status(_pid(srv))["VmHWM"]
        r = _run(srv, src, [8 * MiB])
        after = _status(_pid(srv))["VmHWM"]
        assert after - before < 64 * MiB, f"the server's peak memory grew by {(after - before) >> 20} MiB"
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "FAILED", r.json()
        assert httpx.get(f"{srv.url}/health", timeout=5).status_code == 200


def test_a_long_string_return_counts_against_the_response_limit(limits_server: ServerProcess) -> None:
    src = "def main(n):\n    return 'x' * n\n"
    small = _run(limits_server, src, [RESPONSE_LIMIT // 4])
    assert small.status_code == 200 and small.json()["status"] == "COMPLETED", small.text
    assert len(small.json()["results"]["out"]["value"]) == RESPONSE_LIMIT // 4
    big = _run(limits_server, src, [2 * RESPONSE_LIMIT])
    assert big.status_code == 500, big.text[:300]
    assert big.json()["error"]["kind"] == "response_too_large"


def test_forged_string_returns_cannot_pass_the_response_limit(limits_server: ServerProcess) -> None:
    # Returns sent straight on the channel, each under the limit, together over it.
    src = ("def main(n):\n"
           "    for i in range(4):\n"
           "        executor().chan.send({'t': 'return', 'key': f'k{i}',\n"
           "                              'node': {'type': 'string', 'value': 'x' * n}})\n"
           "    return 1\n")
    r = _run(limits_server, src, [RESPONSE_LIMIT // 3])
    assert r.status_code == 500, r.text[:300]
    assert r.json()["error"]["kind"] == "response_too_large"


def test_a_return_flag_does_not_lift_the_cap_on_a_returned_values_json() -> None:
    # A frame flagged as a return could announce a header as large as the response limit
    # (4 GiB by default): parsed, JSON of nested empty lists takes ~25 times its size.
    # Only the length word is sent: the server must refuse it from that alone.
    src = ("def main():\n"
           "    executor().chan.sock.sendall(struct.pack('>I', (1 << 31) | (96 << 20)))\n"
           "    time.sleep(2)\n"
           "    return 'sent'\n")
    with ServerProcess(["--cpu-workers", "1"]) as srv:
        r = _run(srv, src)
        assert r.status_code == 500, r.text[:300]
        assert r.json()["error"]["kind"] == "response_too_large"
        assert "returned value's JSON" in r.json()["error"]["message"]


def test_attachments_on_a_frame_that_is_not_a_return_are_refused_unread() -> None:
    src = ("def main():\n"
           "    raw = json.dumps({'t': 'step', 'i': 0, 'bin': [64 << 20]}).encode()\n"
           "    executor().chan.sock.sendall(struct.pack('>I', len(raw)) + raw)\n"
           "    time.sleep(2)\n"
           "    return 'sent'\n")
    with ServerProcess(["--cpu-workers", "1"]) as srv:
        r = _run(srv, src)
        assert r.status_code == 200 and r.json()["status"] == "FAILED", r.text[:300]
        assert "attachments on a 'step' frame" in r.json()["error"]["message"]


def test_a_program_draws_a_bounded_number_of_holdout_seeds(limits_server: ServerProcess) -> None:
    # 50 forged requests for 100k seeds once took 18 s of the event loop.
    src = ("def main():\n"
           "    got = []\n"
           "    for _ in range(3):\n"
           "        try:\n"
           "            got.append(len(executor().holdout_seeds('ns', 100000)))\n"
           "        except Exception as exc:\n"
           "            got.append(str(exc))\n"
           "    return got\n")
    r = _run(limits_server, src)
    assert r.status_code == 200 and r.json()["status"] == "COMPLETED", r.text[:300]
    first, second, third = (v["value"] for v in r.json()["results"]["out"]["value"])
    assert first == second == 100000
    assert isinstance(third, str) and "at most 200000 seeds" in third


# ---------------------------------------------------------------------- request bodies
def test_an_oversized_program_part_is_413(limits_server: ServerProcess) -> None:
    def program(pad: int) -> dict[str, Any]:
        src = "#" * pad + "\ndef main():\n    return 1\n"
        return function_program(src).to_dict({"timeout_seconds": 30})

    fits = post_program(limits_server.url, program(MiB))
    assert fits.status_code == 200 and fits.json()["status"] == "COMPLETED", fits.text[:300]
    over = post_program(limits_server.url, program(5 * MiB))
    assert over.status_code == 413, over.text[:300]
    error = over.json()["error"]
    assert error["kind"] == "request_too_large" and "'program' part" in error["message"]


def test_a_queued_request_does_not_hold_its_body(limits_server: ServerProcess) -> None:
    srv, size = limits_server, 48 * MiB
    sleeper = function_program("import time\ndef main():\n    time.sleep(8)\n    return 1\n")
    busy = threading.Thread(target=post_program, args=(srv.url, sleeper.to_dict({"timeout_seconds": 30})))
    busy.start()
    _wait(lambda: any(w["status"] == "busy" for w in srv.health()["workers"]), "the worker never got busy")
    base = _status(_pid(srv))["VmRSS"]
    queued = [threading.Thread(target=_post_blob, args=(srv.url, bytes([i]) + os.urandom(MiB) * (size // MiB)))
              for i in range(2)]
    for t in queued:
        t.start()
    _wait(lambda: srv.health()["queue_length"] == 2, "the requests never queued")
    held = _status(_pid(srv))["VmRSS"] - base
    for t in [busy, *queued]:
        t.join(60)
    assert held < size, f"two queued requests hold {held >> 20} MiB"


def test_a_retry_waiting_on_its_key_does_not_hold_its_body(limits_server: ServerProcess) -> None:
    # A retry of a key whose first attempt still runs waits for its outcome with the
    # program parsed; the blob parts, views of the whole body, kept its 48 MiB meanwhile.
    srv, size = limits_server, 48 * MiB
    data = os.urandom(MiB) * (size // MiB)
    program = function_program("import time\ndef main():\n    time.sleep(8)\n    return 1\n").to_dict(
        {"timeout_seconds": 30})
    program["instructions"].insert(0, {"op": "upload", "kind": "bytes", "id": "b", "blob": sha(data)})
    headers = {"Idempotency-Key": "held-body-" + os.urandom(4).hex()}
    replies: list[httpx.Response] = []

    def send() -> None:
        replies.append(post_program(srv.url, program, {sha(data): data}, headers=headers))

    first = threading.Thread(target=send)
    first.start()
    _wait(lambda: any(w["status"] == "busy" for w in srv.health()["workers"]), "the first attempt never ran")
    base = _status(_pid(srv))["VmRSS"]
    retry = threading.Thread(target=send)
    retry.start()
    time.sleep(3)   # its 48 MiB sent and parsed; the first attempt sleeps 5 s more
    held = _status(_pid(srv))["VmRSS"] - base
    for t in (first, retry):
        t.join(60)
    assert [r.status_code for r in replies] == [200, 200]
    assert held < size // 2, f"a waiting retry holds {held >> 20} MiB"


def _post_blob(url: str, data: bytes) -> None:
    program = {"instructions": [{"op": "upload", "kind": "bytes", "id": "b", "blob": sha(data)}]}
    r = post_program(url, program, {sha(data): data})
    assert r.status_code == 200, r.text[:300]


def _wait(done: Any, why: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


# ---------------------------------------------------------------------- connections
HEAD_TIMEOUT = 4.0


@pytest.fixture(scope="module")
def loris_server() -> Iterator[ServerProcess]:
    # Started under a low soft descriptor limit, which it should raise to the hard one.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
    try:
        srv = ServerProcess(["--cpu-workers", "1", "--header-timeout", str(HEAD_TIMEOUT),
                             "--max-connections", "4"]).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield srv
    finally:
        srv.stop()


def _partial_head(srv: ServerProcess) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"POST /execute HTTP/1.1\r\nHost: x\r\n")  # never finished; no token needed
    return s


def _seconds_until_closed(s: socket.socket, trickle: bool = False) -> float:
    """How long until the server closes `s` (a trickle sends a header byte every 0.3 s)."""
    t0 = time.monotonic()
    s.settimeout(0.3)
    while time.monotonic() - t0 < 15:
        try:
            if s.recv(1024) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            if trickle:
                s.sendall(b"X")
        except ConnectionResetError:
            return time.monotonic() - t0
    return float("inf")


def test_a_connection_that_never_finishes_its_head_is_closed(loris_server: ServerProcess) -> None:
    trickling, quiet = _partial_head(loris_server), _partial_head(loris_server)
    with trickling, quiet:
        # Each byte of a trickle once put off uvicorn's idle timeout; the head's deadline holds.
        assert _seconds_until_closed(trickling, trickle=True) < HEAD_TIMEOUT + 3
        assert _seconds_until_closed(quiet) < HEAD_TIMEOUT + 3
    assert httpx.get(f"{loris_server.url}/health", timeout=5).status_code == 200


def test_connections_beyond_the_limit_are_closed_at_once(loris_server: ServerProcess) -> None:
    held = [_partial_head(loris_server) for _ in range(4)]
    try:
        extra = socket.create_connection(("127.0.0.1", loris_server.port), timeout=10)
        with extra:
            assert _seconds_until_closed(extra) < HEAD_TIMEOUT / 2  # not the head timeout: at once
    finally:
        for s in held:
            s.close()
    # Once the held ones are gone, the server answers again.
    _wait(lambda: _health_ok(loris_server), "the server did not answer again")


def _health_ok(srv: ServerProcess) -> bool:
    try:
        return httpx.get(f"{srv.url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(loris_server: ServerProcess) -> None:
    with open(f"/proc/{_pid(loris_server)}/limits") as f:
        line = next(x for x in f if x.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    assert soft == hard, line


def test_a_body_that_stalls_is_answered_408(loris_server: ServerProcess) -> None:
    # Past its head, a connection trickling its body held its slot as long as it liked.
    with socket.create_connection(("127.0.0.1", loris_server.port), timeout=HEAD_TIMEOUT + 10) as s:
        s.sendall(b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                  b"Content-Length: 1000\r\n\r\n--b\r\n")
        t0 = time.monotonic()
        answer = s.recv(4096)
        assert time.monotonic() - t0 < HEAD_TIMEOUT + 3
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n"))
                          if k.lower() == b"content-length"))
        while len(body) < length and (more := s.recv(4096)):
            body += more
    assert head.startswith(b"HTTP/1.1 408"), head[:200]
    assert b"stalled" in body, body

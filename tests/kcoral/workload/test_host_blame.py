"""Whose fault a host's failure is: the candidate's in its own host, the server's in the
trusted one (the baseline and the no-op). A baseline that breaks on a server (seen on an
H200: Triton's JIT could not run the C compiler) must not come back as the candidate's
`runtime` failure, which a search counts against the point and its neighbours.

The real `Host.serve` loop on one end of a socket pair, in a thread; the test is the judge.
"""
from __future__ import annotations

import socket
import threading

from judge.backend import make_backend
from judge.channel import Channel
from judge.host import Host, Session


def _raises():
    raise RuntimeError("Command '['/usr/bin/gcc', 'cuda_utils.c']' returned non-zero exit status 1.")


def _reply_to_failing_call(role: str) -> dict:
    ours, theirs = socket.socketpair()
    host = Host(Channel(theirs), role, make_backend("cpu"))
    session = Session(buffer=None)
    session.fn = _raises
    host.sessions[1] = session
    serving = threading.Thread(target=host.serve, daemon=True)
    serving.start()
    judge = Channel(ours)
    try:
        judge.send({"op": "call", "session": 1})
        reply, _ = judge.recv(timeout=30)
        judge.send({"op": "exit"})
    finally:
        serving.join(timeout=30)
        ours.close()
        theirs.close()
    assert not serving.is_alive()
    return reply


def test_a_candidate_that_raises_is_a_runtime_failure():
    reply = _reply_to_failing_call("candidate")
    assert reply["ok"] is False
    assert reply["kind"] == "runtime"
    assert "fn() raised" in reply["message"]


def test_a_baseline_that_raises_is_the_servers_fault():
    reply = _reply_to_failing_call("trusted")
    assert reply["ok"] is False
    assert reply["kind"] == "unavailable"
    assert reply["message"].startswith("the baseline failed on this server, not the candidate")
    assert "gcc" in reply["message"]   # the cause travels with it

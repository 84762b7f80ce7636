"""Small helpers for server tests: raw multipart posts and one-function programs."""
from __future__ import annotations

import hashlib
import json
import os
import time
import signal
import secrets
from typing import Any

import httpx

from kcoral import Program
from kcoral.protocol.multipart import encode_multipart


def post_raw(url: str, parts: list[tuple[str, str, bytes]], headers: dict[str, str] | None = None,
             content_type: str | None = None, timeout: float = 30) -> httpx.Response:
    ctype, chunks = encode_multipart(parts)
    body = b"".join(bytes(c) for c in chunks)
    h = {"Content-Type": content_type or ctype, **(headers or {})}
    return httpx.post(f"{url}/execute", content=body, headers=h, timeout=timeout)


def post_program(url: str, program: dict[str, Any] | str | bytes, blobs: dict[str, bytes] | None = None,
                 headers: dict[str, str] | None = None) -> httpx.Response:
    raw = program if isinstance(program, (bytes, str)) else json.dumps(program)
    raw = raw.encode() if isinstance(raw, str) else raw
    parts = [("program", "application/json", raw)]
    parts += [(f"blob:{d}", "application/octet-stream", b) for d, b in (blobs or {}).items()]
    return post_raw(url, parts, headers)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def function_program(source: str, name: str = "main", args: list[Any] | None = None,
                     key: str = "out", cpu_only: bool = False) -> Program:
    """A program that uploads `source`, runs `name(*args)` and returns it as `key`."""
    p = Program()
    mod = p.upload(kind="module", source=source)
    fn = p.get_function(module=mod, name=name, cpu_only=cpu_only)
    out = p.run(fn=fn, args=args or [])
    p.return_(key=key, value=out)
    return p


def unique_sleep() -> str:
    """A `sleep` duration no other process uses: the test finds the process by its argv
    from outside (a sandboxed program's pids are its own namespace's)."""
    return f"{300 + secrets.randbelow(10 ** 6) / 10 ** 6:.6f}"


def processes_with_argv(*argv: str) -> list[int]:
    """Host pids of live (not zombie) processes whose command line is exactly `argv`."""
    want = "\0".join(argv).encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read() != want:
                    continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(name))
    return found



def assert_gone_then_kill(argv: tuple[str, ...], within: float, why: str) -> None:
    """Wait up to `within` seconds for every process with this argv to end; fail with `why`
    if one is left, killing it either way."""
    try:
        deadline = time.monotonic() + within
        while processes_with_argv(*argv) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes_with_argv(*argv), why
    finally:
        for pid in processes_with_argv(*argv):
            os.kill(pid, signal.SIGKILL)


def needs_request_memory(srv: Any) -> None:
    """Skip, saying why, where the server could make no memory cgroup per request (most
    unprivileged servers; the attack tests of those cgroups need one)."""
    import pytest

    if srv.health()["sandbox"]["request_memory"] is None:
        pytest.skip("no writable memory cgroup on this machine: the server runs without one")

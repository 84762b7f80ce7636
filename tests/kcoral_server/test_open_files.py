"""The descriptor limit of a request's processes (--max-open-files): what the server can
give, what it refuses to start with, and what a worker says when descriptors are dropped."""
from __future__ import annotations

import os
import resource
import socket

import pytest
from pydantic import ValidationError

from kcoral_server import engine
from kcoral_server.config import MIN_OPEN_FILES, ServerConfig
from kcoral_server.executor import receive_blob_fds


def test_a_limit_with_no_room_for_a_programs_blobs_is_refused() -> None:
    with pytest.raises(ValidationError, match=f"at least {MIN_OPEN_FILES}"):
        ServerConfig(max_open_files=256)
    assert ServerConfig(max_open_files=0).max_open_files == 0


def test_more_than_the_servers_hard_limit_is_clamped_to_it(monkeypatch) -> None:
    # Asked for more than the server's hard limit, every worker failed to start (a process
    # cannot raise its hard limit), and only the worker's stderr said why.
    monkeypatch.setattr(engine.resource, "getrlimit", lambda _res: (1500, 1500))
    assert engine._open_files(4096) == 1500
    assert engine._open_files(0) == 1500      # 0: the server's own
    assert engine._open_files(1200) == 1200


def test_descriptors_dropped_in_passing_are_a_clear_error() -> None:
    # The kernel drops what a receiver has no room for and says so only in MSG_CTRUNC: the
    # worker waited for the missing blobs until the program's timeout.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    a, b = socket.socketpair()
    b.settimeout(10)   # before the check: waits for blobs that never come
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        socket.send_fds(a, [b"x"], [fd] * 64)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with pytest.raises(RuntimeError, match="dropped in passing"):
            receive_blob_fds(b, [f"{i:064x}" for i in range(64)], verify=False)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        os.close(fd)
        a.close()
        b.close()


def test_an_out_of_range_flag_is_named_not_a_traceback() -> None:
    from kcoral_server.cli import build_parser, config_from_args

    for argv, flag in ((["--max-open-files", "256"], "--max-open-files"), (["--max-processes", "-1"], "--max-processes")):
        with pytest.raises(SystemExit) as info:
            config_from_args(build_parser().parse_args(["--cpu-workers", "1", *argv]))
        assert str(info.value).startswith(f"kcoral-server: {flag}: ")

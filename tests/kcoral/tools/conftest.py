"""Fixtures of the tools' integration tests: one real server process on loopback (CPU
workers) whose PATH starts with a directory holding the FAKE `ncu` (fakes/fake_ncu.py)."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).parent
FAKES = HERE / "fakes"
FIXTURES = HERE / "fixtures"


@pytest.fixture(scope="session")
def fake_ncu_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bin directory whose `ncu` is the fake (a shell wrapper around fake_ncu.py)."""
    bin_dir = tmp_path_factory.mktemp("fake-ncu-bin")
    bin_dir.chmod(0o755)  # the server's sandboxed programs run as another uid and must find it
    wrapper = bin_dir / "ncu"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKES / "fake_ncu.py"}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


@pytest.fixture(scope="session")
def server(fake_ncu_bin: Path) -> Iterator[object]:
    from tests.serverproc import ServerProcess

    env = {"PATH": f"{fake_ncu_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    with ServerProcess(["--cpu-workers", "2"], env=env) as srv:
        yield srv


@pytest.fixture()
def url(server: object) -> str:
    return server.url  # type: ignore[attr-defined]


@pytest.fixture()
def client(url: str) -> Iterator[object]:
    from kcoral import Client

    with Client(url) as c:
        yield c

"""Shared fixtures of the workload tests: paths, the judge on sys.path, a real CPU server
with a known holdout salt, and staging of the broken candidates."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
KDA = REPO / "kcoral" / "workloads" / "kda"
CPU_WORKLOAD = KDA / "forward_cpu_small"
GPU_WORKLOAD = KDA / "forward_b1_t8192_h96"
REFERENCE = CPU_WORKLOAD / "scratch" / "reference"
BROKEN = REPO / "tests" / "fixtures" / "kda_broken"
SALT = "kda-test-salt-6f1d0c9e2b7a4458"

if str(KDA) not in sys.path:
    sys.path.insert(0, str(KDA))  # the judge package, as the server imports it


@pytest.fixture(scope="session")
def salt_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("salt") / "holdout_salt"
    path.write_text(SALT + "\n")
    return path


@pytest.fixture(scope="session")
def server(salt_file):
    from tests.serverproc import ServerProcess

    with ServerProcess(["--cpu-workers", "2", "--holdout-salt-file", str(salt_file)]) as srv:
        yield srv


@pytest.fixture()
def client(server):
    from kcoral.client import Client

    with Client(server.url) as c:
        yield c


def stage_broken(name: str, dest: Path) -> Path:
    """A broken fixture plus the reference as correct.py (see tests/fixtures/kda_broken)."""
    target = dest / name
    shutil.copytree(BROKEN / name, target)
    shutil.copyfile(REFERENCE / "solution.py", target / "correct.py")
    return target

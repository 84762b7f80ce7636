"""What an honest program finds in its sandbox: a user name for its uid, and a home, temp
and cache folders it can write. Libraries rely on these (getpass.getuser() names torch and
triton's caches; an unnamed uid made the KDA judge lose its fla baseline on the GPU)."""
from __future__ import annotations

import os

import pytest

from kcoral import Client
from tests.serverproc import ServerProcess

from .helpers import function_program

PROBE = r'''
import getpass, os, pwd, grp, tempfile

def main():
    uid = os.getuid()
    entry = pwd.getpwuid(uid)
    written = []
    for d in (os.path.expanduser("~"), tempfile.gettempdir(), os.environ["CUPY_CACHE_DIR"]):
        # as they are: CuPy writes its kernel cache into $CUPY_CACHE_DIR without creating it
        with tempfile.NamedTemporaryFile(dir=d) as f:
            f.write(b"x")
        written.append(d)
    return {"uid": uid, "user": getpass.getuser(), "pw_name": entry.pw_name, "pw_dir": entry.pw_dir,
            "group": grp.getgrgid(os.getgid()).gr_name, "written": written}
'''


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--cpu-workers", "2"]) as srv:
        yield srv


def test_the_programs_uid_has_a_name_and_its_folders_are_writable(server) -> None:
    with Client(server.url) as c:
        out = c.execute(function_program(PROBE), timeout_seconds=60).raise_for_failure().results["out"]
    assert out["user"] == out["pw_name"]
    assert len(out["written"]) == 3
    if os.geteuid() == 0:  # each slot runs as a uid of its own, named after its slot
        assert out["uid"] >= 2_000_000_000 and out["pw_name"].startswith("kcoral")
        assert out["pw_dir"] == "/kcoral/home" and out["group"] == out["pw_name"]

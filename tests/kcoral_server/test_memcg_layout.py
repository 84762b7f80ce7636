"""Where the server finds its memory cgroup, and how it takes one for requests on cgroup v2.

The real hierarchy is used by the attack tests (test_sandbox_escapes.py, on this VM's cgroup
v1); v2's hand-down and a container's mount roots are checked here on a FAKE tree of plain
files and directories, which records what is written but enforces none of the kernel's rules."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from kcoral_server import memcg


@pytest.mark.parametrize(("root", "path", "expected"), [
    ("/", "/system.slice/kcoral.service", "/sys/fs/cgroup/system.slice/kcoral.service"),
    ("/docker/abc", "/docker/abc", "/sys/fs/cgroup"),                # a container's own cgroup
    ("/docker/abc", "/docker/abc/sub", "/sys/fs/cgroup/sub"),
    ("/docker/abc", "/docker/other", None),                          # not beneath the mount
])
def test_a_cgroup_is_found_beneath_its_mounts_root(root, path, expected) -> None:
    got = memcg._beneath("/sys/fs/cgroup", root, path)
    assert (None if got is None else str(got)) == expected


def _fake_cgroup(d: Path) -> Path:
    """What the kernel puts in a new cgroup, as plain files."""
    (d / "cgroup.subtree_control").write_text("")
    (d / "cgroup.procs").write_text("")
    return d


@pytest.fixture
def own(tmp_path, monkeypatch) -> Path:
    real_mkdir = Path.mkdir

    def mkdir_cgroup(self: Path, *args, **kwargs) -> None:
        real_mkdir(self, *args, **kwargs)
        _fake_cgroup(self)

    monkeypatch.setattr(Path, "mkdir", mkdir_cgroup)
    d = tmp_path / "own"
    d.mkdir()
    return d


def test_on_v2_the_server_moves_into_a_leaf_before_memory_is_handed_down(own: Path) -> None:
    root = own / f"{memcg.PREFIX}{os.getpid()}"
    root.mkdir()
    memcg._delegate(own, root)
    assert (root / memcg.SERVER_LEAF / "cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text() == "+memory"
    assert (root / "cgroup.subtree_control").read_text() == "+memory"


def test_on_v2_a_refused_hand_down_moves_the_server_back(own: Path, monkeypatch) -> None:
    # Another process in our cgroup: the kernel refuses the hand-down (EBUSY).
    real_write = memcg._write

    def busy(path: Path, text: str) -> None:
        if path == own / "cgroup.subtree_control":
            raise OSError(16, "Device or resource busy")
        real_write(path, text)

    monkeypatch.setattr(memcg, "_write", busy)
    root = own / f"{memcg.PREFIX}{os.getpid()}"
    root.mkdir()
    with pytest.raises(OSError, match="other processes share the server's cgroup"):
        memcg._delegate(own, root)
    assert (own / "cgroup.procs").read_text() == str(os.getpid())

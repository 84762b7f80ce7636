"""The sandbox module on its own: the path rules, opens that refuse links, the unpacker
against hostile members and a destination with links in it, and the process-tree kill
against processes that ignore SIGTERM."""
from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from kcoral.runners import sandboxed
from kcoral.runners.sandboxed import (ArchiveError, NotRegularFile, PathError, kill_tree,
                                      normalize_path, open_read, open_read_under, open_write,
                                      safe_unpack)

from .test_archive import _info, _tar


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _survivors(pids: list[int]) -> list[int]:
    """Those of ``pids`` still alive after up to 5 s (killed here, so none is left behind)."""
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, 9)
    return left


# ---------------------------------------------------------------- paths
def test_one_normaliser_for_files_folders_and_archive_members() -> None:
    assert normalize_path("./a//b/./c") == "a/b/c"
    assert normalize_path("a/", allow_root=True) == "a"
    assert normalize_path("./", allow_root=True) == normalize_path(".", allow_root=True) == ""
    for bad in ("", "/a", "a/../b", "..", "a\\b", "a\x00b", ".", "a/"):
        with pytest.raises(PathError):
            normalize_path(bad)
    with pytest.raises(PathError):
        normalize_path(3)  # type: ignore[arg-type]

    class LayerError(ValueError):
        pass

    with pytest.raises(LayerError, match="'..' component"):
        normalize_path("a/../b", error=LayerError)


# ---------------------------------------------------------------- no-follow opens
def test_opens_refuse_links_anywhere_on_the_path(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("SECRET")
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "ok").write_text("fine")
    (root / "leaf").symlink_to(outside / "secret")
    (root / "via").symlink_to(outside)
    with os.fdopen(open_read_under(str(root), "d/ok"), "rb") as fh:
        assert fh.read() == b"fine"
    for rel in ("leaf", "via/secret"):
        with pytest.raises(OSError) as info:
            open_read_under(str(root), rel)
        assert info.value.errno in (errno.ELOOP, errno.ENOTDIR)
    # A link put where a file is to be written is neither followed nor replaced.
    for exclusive in (True, False):
        with pytest.raises(OSError):
            open_write(str(root / "leaf"), exclusive=exclusive)
    assert (outside / "secret").read_text() == "SECRET"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    t0 = time.monotonic()
    with pytest.raises(NotRegularFile):
        open_read(str(tmp_path / "pipe"))
    assert time.monotonic() - t0 < 5


def test_exclusive_write_refuses_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("old")
    with pytest.raises(FileExistsError):
        open_write(str(tmp_path / "f"))
    with os.fdopen(open_write(str(tmp_path / "f"), exclusive=False), "w") as fh:
        fh.write("new")
    assert (tmp_path / "f").read_text() == "new"


# ---------------------------------------------------------------- tar archives
@pytest.mark.parametrize("planted", ["file", "dir"])
def test_unpack_never_writes_through_a_link_already_in_the_destination(tmp_path: Path, planted: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep")
    dest = tmp_path / "dest"
    dest.mkdir()
    if planted == "file":  # the member's own name is a link to a file outside
        (dest / "victim").symlink_to(outside / "victim")
        data = _tar([("victim", b"overwritten")])
    else:  # a directory member where a link to a folder outside is
        (dest / "sub").symlink_to(outside)
        data = _tar([_info("sub", tarfile.DIRTYPE), ("sub/new", b"x")])
    with pytest.raises(ArchiveError, match="symbolic link|already exists"):
        safe_unpack(data, dest)
    assert (outside / "victim").read_text() == "keep"
    assert sorted(os.listdir(outside)) == ["victim"]


def test_unpack_refuses_hostile_members_before_writing(tmp_path: Path) -> None:
    cases = [
        (_info("l", tarfile.SYMTYPE, linkname="/etc/passwd"), "link"),
        (_info("null", tarfile.CHRTYPE, devmajor=1, devminor=3), "device"),
        (("../up", b"x"), "refused archive path '../up' has a '..' component"),
        (("/abs", b"x"), "refused archive path '/abs' is absolute"),
        (("big", b"x" * 2000), "too large once unpacked"),
    ]
    for member, why in cases:
        with pytest.raises(ArchiveError, match=why):  # after a harmless entry: nothing written
            safe_unpack(_tar([("ok", b"1"), member]), tmp_path, max_total_bytes=1000)
        assert os.listdir(tmp_path) == []


def test_unpack_keeps_the_executable_bit_only(tmp_path: Path) -> None:
    run = tarfile.TarInfo("run.sh")
    run.mode, run.size = 0o4777, 2  # setuid and world-writable are dropped
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(run, io.BytesIO(b"ok"))
    assert safe_unpack(buf.getvalue(), tmp_path) == ["run.sh"]
    assert (tmp_path / "run.sh").stat().st_mode & 0o7777 == 0o755 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------- processes
STUBBORN = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)      # ignored by every process below
    if os.fork() == 0:
        if os.fork() == 0:
            open(sys.argv[1] + ".grandchild", "w").write(str(os.getpid()))
            time.sleep(600)
        open(sys.argv[1] + ".child", "w").write(str(os.getpid()))
        time.sleep(600)
    while True:
        time.sleep(1)
""")


def _pids(base: Path) -> list[int]:
    deadline = time.monotonic() + 30
    names = [base.with_name(base.name + s) for s in (".child", ".grandchild")]
    while not all(n.exists() and n.read_text() for n in names) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [int(n.read_text()) for n in names]


def _run_and_kill(tmp_path: Path, grace_s: float, **popen) -> tuple[int, list[int], float]:
    base = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN, str(base)], **popen)
    pids = _pids(base)
    t0 = time.monotonic()
    code = kill_tree(proc, grace_s=grace_s)
    return code, pids, time.monotonic() - t0


@pytest.mark.parametrize("own_group", [False, True])
def test_a_tree_that_ignores_sigterm_is_killed(tmp_path: Path, own_group: bool) -> None:
    kw = {"process_group": 0} if own_group else {}
    code, pids, took = _run_and_kill(tmp_path, 0.5, **kw)
    assert _survivors(pids) == []
    assert code == -9  # TERM was ignored: KILL after the grace
    assert 0.4 < took < 20


def test_children_die_even_when_their_parent_obeys_sigterm(tmp_path: Path) -> None:
    # The parent exits on SIGTERM at once; its children ignore it and must not survive.
    script = textwrap.dedent("""
        import os, signal, sys, time
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            open(sys.argv[1], "w").write(str(os.getpid()))
            time.sleep(600)
        time.sleep(600)
    """)
    pid_file = tmp_path / "child"
    proc = subprocess.Popen([sys.executable, "-c", script, str(pid_file)])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(pid_file.read_text())
    code = kill_tree(proc, grace_s=5)
    assert _survivors([child]) == []
    assert code == -15


def test_a_subreaper_sweeps_its_orphans_but_keeps_what_it_is_told_to(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import ctypes, os, signal, subprocess, sys, time
        sys.path.insert(0, sys.argv[1])
        import sandboxed
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        keep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if os.fork() == 0:          # a double-forked daemon that ignores SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        os.wait()
        time.sleep(0.2)
        before = sorted(sandboxed.children_by_parent().get(os.getpid(), []))
        sandboxed.kill_orphans(keep={keep.pid})
        after = sandboxed.children_by_parent().get(os.getpid(), [])
        print(len(before), after == [keep.pid])
        keep.kill()
    """)
    here = str(Path(sandboxed.__file__).parent)
    out = subprocess.run([sys.executable, "-c", code, here], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["2", "True"], out.stderr

"""Archive packing and safe unpacking: what is refused, and that a refusal writes nothing."""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from kcoral.archive import pack_directories, pack_directory
from kcoral.runners.sandboxed import ArchiveError, PathError, check_archive, normalize_path, safe_unpack


def _tar(entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for e in entries:
            if isinstance(e, tuple):
                info = tarfile.TarInfo(e[0])
                info.size = len(e[1])
                tar.addfile(info, io.BytesIO(e[1]))
            else:
                tar.addfile(e)
    return buf.getvalue()


def _info(name: str, kind: bytes, **kw) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def _tree(root: Path) -> None:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "sub" / "data.bin").write_bytes(bytes(range(256)) * 10)
    (root / "solution.py").write_text("print('hi')\n")
    run = root / "run.sh"
    run.write_text("#!/bin/sh\necho ok\n")
    run.chmod(0o755)
    (root / "empty").mkdir()


def test_round_trip_keeps_contents_modes_and_empty_dirs(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    _tree(src)
    written = safe_unpack(pack_directory(src), dst)
    assert sorted(written) == ["pkg/sub/data.bin", "run.sh", "solution.py"]
    assert (dst / "pkg/sub/data.bin").read_bytes() == bytes(range(256)) * 10
    assert os.access(dst / "run.sh", os.X_OK)
    assert not os.access(dst / "solution.py", os.X_OK)
    assert (dst / "empty").is_dir()


def test_packing_is_reproducible(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert pack_directory(tmp_path) == pack_directory(tmp_path)


def test_prefix_places_directory_under_subdir(tmp_path: Path) -> None:
    a, b, dst = tmp_path / "a", tmp_path / "b", tmp_path / "dst"
    for d in (a, b, dst):
        d.mkdir()
    (a / "x.py").write_text("a")
    (b / "x.py").write_text("b")
    safe_unpack(pack_directories([(a, ""), (b, "lib/b")]), dst)
    assert (dst / "x.py").read_text() == "a"
    assert (dst / "lib/b/x.py").read_text() == "b"


def test_colliding_sends_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x.py").write_text("a")
    (b / "x.py").write_text("b")
    with pytest.raises(ArchiveError, match="collide at 'x.py'"):
        pack_directories([(a, ""), (b, "")])
    # A file in one send where the other needs a directory collides as well.
    (a / "lib").write_text("file")
    (b / "y.py").write_text("y")
    (b / "x.py").unlink()
    with pytest.raises(ArchiveError, match="collide at 'lib'"):
        pack_directories([(a, ""), (b, "lib")])


def test_sends_sharing_a_directory_do_not_collide(tmp_path: Path) -> None:
    a, b, dst = tmp_path / "a", tmp_path / "b", tmp_path / "dst"
    for d in (a / "common", b / "common", dst):
        d.mkdir(parents=True)
    (a / "common" / "one").write_text("1")
    (b / "common" / "two").write_text("2")
    safe_unpack(pack_directories([(a, ""), (b, "")]), dst)
    assert sorted(os.listdir(dst / "common")) == ["one", "two"]


def test_pack_refuses_symlink(tmp_path: Path) -> None:
    (tmp_path / "real.py").write_text("x")
    (tmp_path / "link.py").symlink_to(tmp_path / "real.py")
    with pytest.raises(ArchiveError, match="symbolic link"):
        pack_directory(tmp_path)


def test_pack_refuses_symlinked_directory_itself(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    with pytest.raises(ArchiveError, match="symbolic link"):
        pack_directory(tmp_path / "alias")


def test_pack_refuses_hardlink(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    os.link(tmp_path / "a", tmp_path / "b")
    with pytest.raises(ArchiveError, match="hard link"):
        pack_directory(tmp_path)


def test_pack_refuses_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ArchiveError, match="not a regular file"):
        pack_directory(tmp_path)


@pytest.mark.parametrize("data, message", [
    (lambda: _tar([("../evil.py", b"x")]), "'..'"),
    (lambda: _tar([("a/../../evil.py", b"x")]), "'..'"),
    (lambda: _tar([("/etc/evil", b"x")]), "absolute"),
    (lambda: _tar([("a\\..\\b", b"x")]), "backslash"),
    (lambda: _tar([_info("ln", tarfile.SYMTYPE, linkname="/etc/passwd")]), "link"),
    (lambda: _tar([("a", b"x"), _info("b", tarfile.LNKTYPE, linkname="a")]), "link"),
    (lambda: _tar([_info("tty", tarfile.CHRTYPE, devmajor=5, devminor=0)]), "device"),
    (lambda: _tar([_info("sda", tarfile.BLKTYPE, devmajor=8, devminor=0)]), "device"),
    (lambda: _tar([_info("fifo", tarfile.FIFOTYPE)]), "FIFO"),
    (lambda: _tar([("a.py", b"1"), ("./a.py", b"2")]), "duplicate"),
    (lambda: _tar([("a", b"1"), ("a/b", b"2")]), "under the file"),
    (lambda: _tar([("a/b", b"2"), ("a", b"1")]), "both a file and a directory"),
    (lambda: b"this is not a tar archive at all" * 40, "tar"),
])
def test_unpack_refuses_attacks_and_writes_nothing(tmp_path: Path, data, message) -> None:
    payload = data()
    # A harmless first entry proves that validation happens before any write.
    if payload[:4] != b"this":
        with tarfile.open(fileobj=io.BytesIO(payload)) as t:
            members = [(m, t.extractfile(m).read() if m.isreg() else None) for m in t]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as out:
            first = tarfile.TarInfo("harmless.txt")
            first.size = 2
            out.addfile(first, io.BytesIO(b"ok"))
            for m, body in members:
                out.addfile(m, io.BytesIO(body) if body is not None else None)
        payload = buf.getvalue()
    with pytest.raises(ArchiveError, match=message):
        safe_unpack(payload, tmp_path)
    assert os.listdir(tmp_path) == []
    assert not (tmp_path.parent / "evil.py").exists()


def test_unpack_caps_total_size(tmp_path: Path) -> None:
    data = _tar([("a.bin", b"x" * 600), ("b.bin", b"y" * 600)])
    assert check_archive(data, max_total_bytes=1200) == ["a.bin", "b.bin"]
    with pytest.raises(ArchiveError, match="exceed the limit of 1000 bytes"):
        safe_unpack(data, tmp_path, max_total_bytes=1000)
    assert os.listdir(tmp_path) == []


def test_unpack_caps_member_count(tmp_path: Path) -> None:
    data = _tar([(f"f{i}", b"") for i in range(5)])
    with pytest.raises(ArchiveError, match="more than 4 entries"):
        safe_unpack(data, tmp_path, max_members=4)


def test_unpack_never_writes_through_an_existing_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    dest = tmp_path / "dest"
    outside.mkdir()
    dest.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(ArchiveError, match="symbolic link"):
        safe_unpack(_tar([("sub/x", b"1")]), dest)
    assert os.listdir(outside) == []


def test_normalize_member_path() -> None:
    assert normalize_path("./a//b/./c", allow_root=True) == "a/b/c"
    assert normalize_path("./", allow_root=True) == ""
    for bad in ("", "/a", "a/../b", "a\x00b", "a\\b"):
        with pytest.raises(PathError):
            normalize_path(bad, allow_root=True)

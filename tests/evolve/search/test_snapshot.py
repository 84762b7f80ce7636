"""The private copy a stage runs (evolve/digest.py `snapshot`): written from the bytes it
is digested from, never through a link, refused unless it is what was registered."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from evolve.digest import SourcesChanged, snapshot, source_digest


def _folder(root: Path) -> Path:
    d = root / "cand"
    (d / "sub").mkdir(parents=True)
    (d / "solution.py").write_text("def setup():\n    pass\n")
    (d / "sub" / "kernel.cu").write_text("// kernel\n")
    (d / "params.json").write_text('{"params": {}}')
    return d


def test_the_copy_holds_every_file_and_the_registered_digest(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    (tmp_path / "run").mkdir()
    copy = snapshot(d, source_digest(d), tmp_path / "run")
    assert copy.name == d.name and source_digest(copy) == source_digest(d)
    # params.json is not digested, so it is not copied: a candidate could have changed it
    # unseen (the stage writes it from the candidate's record instead).
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        "solution.py", "sub/kernel.cu"]


def test_an_edited_folder_is_refused(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    digest = source_digest(d)
    (d / "solution.py").write_text("raise SystemExit\n")
    (tmp_path / "run").mkdir()
    with pytest.raises(SourcesChanged, match="changed since registration"):
        snapshot(d, digest, tmp_path / "run")


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_link_is_never_followed(tmp_path: Path, where: str) -> None:
    # A file or folder replaced by a link (to a secret, or to /dev/zero) is refused, and
    # nothing beyond the candidate is read into the copy.
    d = _folder(tmp_path)
    digest = source_digest(d)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "kernel.cu").write_text("TOKEN\n")
    if where == "file":
        (d / "solution.py").unlink()
        os.symlink("/dev/zero", d / "solution.py")
    else:
        (d / "sub" / "kernel.cu").unlink()
        (d / "sub").rmdir()
        os.symlink(secret, d / "sub")
    (tmp_path / "run").mkdir()
    with pytest.raises(SourcesChanged, match="symbolic link"):
        snapshot(d, digest, tmp_path / "run")
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file()]

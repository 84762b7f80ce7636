"""The workspace never follows a symbolic link, and disappears after the request."""
from __future__ import annotations

import os
import time

from kcoral import Client, Program

from .helpers import function_program

MAKE_LINK = "import os\ndef main(target, name):\n    os.symlink(target, name)\n"


def _link_then(program_tail, target: str, name: str) -> Program:
    p = Program()
    mod = p.upload(kind="module", source=MAKE_LINK + "def mkfifo(name):\n    os.mkfifo(name)\n")
    p.run(fn=p.get_function(module=mod, name="main"), args=[target, name])
    program_tail(p, mod)
    return p


def test_file_upload_through_a_symlinked_directory_is_refused(client: Client, tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    p = _link_then(lambda p, m: p.upload(kind="file", path="link/x.txt", value=b"evil"), str(outside), "link")
    res = client.execute(p, timeout_seconds=30)
    assert res.status == "FAILED" and res.error.kind == "runtime" and "symbolic link" in res.error.message
    assert res.error.instruction_index == 3
    assert list(outside.iterdir()) == []


def test_file_upload_onto_a_symlink_does_not_write_its_target(client: Client, tmp_path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    p = _link_then(lambda p, m: p.upload(kind="file", path="f.txt", value=b"overwritten"), str(target), "f.txt")
    res = client.execute(p, timeout_seconds=30)
    assert res.status == "FAILED" and res.error.kind == "runtime"
    assert target.read_text() == "keep"


def test_returns_refuse_links_and_special_files(client: Client, tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not return")
    cases = [
        (lambda p, m: p.return_(key="f", kind="file", path="lnk"), str(secret), "lnk"),
        (lambda p, m: p.return_(key="f", kind="folder", path="."), str(secret), "lnk"),
        (lambda p, m: p.return_(key="f", kind="file", path="d/secret.txt"), str(tmp_path), "d"),
        (lambda p, m: p.return_(key="f", kind="folder", path="d"), str(tmp_path), "d"),
    ]
    for tail, target, name in cases:
        res = client.execute(_link_then(tail, target, name), timeout_seconds=30)
        assert res.status == "FAILED" and "symbolic link" in res.error.message, res.error
        assert res.results == {}
    fifo = Program()
    mod = fifo.upload(kind="module", source="import os\ndef main():\n    os.mkdir('d')\n    os.mkfifo('d/pipe')\n")
    fifo.run(fn=fifo.get_function(module=mod, name="main"))
    fifo.return_(key="f", kind="folder", path="d")
    res = client.execute(fifo, timeout_seconds=30)
    assert res.status == "FAILED" and "special file" in res.error.message
    fifo2 = Program()
    mod = fifo2.upload(kind="module", source="import os\ndef main():\n    os.mkfifo('pipe')\n")
    fifo2.run(fn=fifo2.get_function(module=mod, name="main"))
    fifo2.return_(key="f", kind="file", path="pipe")
    res = client.execute(fifo2, timeout_seconds=30)
    assert res.status == "FAILED" and "not a regular file" in res.error.message


def test_workspace_is_fresh_private_and_removed(client: Client) -> None:
    src = "import os\ndef main():\n    return [os.getcwd(), sorted(os.listdir('.')), oct(os.stat('.').st_mode & 0o777)]\n"
    p = Program()
    p.upload(kind="file", path="a/b.txt", value=b"x")
    mod = p.upload(kind="module", source=src)
    p.return_(key="out", value=p.run(fn=p.get_function(module=mod, name="main")))
    first = client.execute(p, timeout_seconds=30).raise_for_failure().results["out"]
    cwd, listing, mode = first
    assert listing == ["a"] and mode == "0o700"
    deadline = time.monotonic() + 5
    while os.path.exists(cwd) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(cwd)
    second = client.execute(function_program(src), timeout_seconds=30).raise_for_failure().results["out"]
    assert second[1] == []  # fresh: nothing of the first request


def test_uploaded_file_modes(client: Client) -> None:
    p = Program()
    p.upload(kind="file", path="deep/er/f.bin", value=b"123")
    mod = p.upload(kind="module", source="import os\ndef main():\n    return [oct(os.stat(p).st_mode & 0o777) for p in ('deep', 'deep/er', 'deep/er/f.bin')]\n")
    p.return_(key="m", value=p.run(fn=p.get_function(module=mod, name="main")))
    assert client.execute(p, timeout_seconds=30).raise_for_failure().results["m"] == ["0o700", "0o700", "0o600"]

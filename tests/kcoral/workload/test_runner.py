"""The server-side runner on its own (a real subprocess, no server): archive refusals,
a crashing candidate, a hanging one."""
from __future__ import annotations

import io
import tarfile

import pytest

from judge import runner
from kcoral.runners.sandboxed import ArchiveError
from kcoral.bench.staging import bench_archive, load_workload

from .conftest import CPU_WORKLOAD


def tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if member.isreg():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return buf.getvalue()


@pytest.mark.parametrize("make, why", [
    (lambda: tar_with(tarfile.TarInfo("../escape.py"), b"x"), "'..'"),
    (lambda: tar_with(tarfile.TarInfo("/abs/path.py"), b"x"), "refused archive path"),
    (lambda: tar_with(_link("candidate/solution.py", tarfile.SYMTYPE)), "link"),
    (lambda: tar_with(_link("candidate/solution.py", tarfile.LNKTYPE)), "link"),
])
def test_unpack_refuses(tmp_path, make, why):
    with pytest.raises(ArchiveError, match=why):
        runner.unpack(make(), str(tmp_path))
    assert not (tmp_path.parent / "escape.py").exists()


def _link(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = "/etc/passwd"
    return info


def test_bench_reports_bad_archive(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = runner.bench(b"not a tar", [1], {})
    assert out["report"] is None and "bad bench archive" in out["runner_error"]


def _candidate(tmp_path, body: str):
    cand = tmp_path / "cand"
    cand.mkdir()
    (cand / "solution.py").write_text(body)
    return cand


def test_crashing_candidate_fails_and_keeps_the_log(tmp_path, monkeypatch):
    cand = _candidate(tmp_path, "import os, sys\nprint('dying now', file=sys.stderr)\n"
                                "def setup(data, B, T, H):\n    os._exit(7)\n")
    archive = bench_archive(load_workload(CPU_WORKLOAD), cand)
    monkeypatch.chdir(tmp_path)
    out = runner.bench(archive, [1, 2, 3, 4, 5], {"timeout_s": 60})
    # the candidate's process died, not the judge: a report says so, with its prints
    rep = out["report"]
    assert rep is not None and rep["passed"] is False and out["exit_code"] == 1
    assert "died" in rep["message"] and "exit status 7" in rep["message"]
    assert "dying now" in out["log"]


def test_hanging_candidate_is_stopped(tmp_path, monkeypatch):
    cand = _candidate(tmp_path, "import time\ndef setup(data, B, T, H):\n    time.sleep(600)\n")
    archive = bench_archive(load_workload(CPU_WORKLOAD), cand)
    monkeypatch.chdir(tmp_path)
    out = runner.bench(archive, [1], {"timeout_s": 3})
    assert out["timed_out"] is True and out["report"] is None


def test_import_error_is_an_import_failure(tmp_path, monkeypatch):
    cand = _candidate(tmp_path, "import no_such_module_xyz\n")
    archive = bench_archive(load_workload(CPU_WORKLOAD), cand)
    monkeypatch.chdir(tmp_path)
    out = runner.bench(archive, [1], {"timeout_s": 60})
    rep = out["report"]
    assert rep["passed"] is False and rep["failure_kind"] == "import"
    assert "no_such_module_xyz" in rep["message"]

"""Review findings on the tools' safe unpack and output collection, and the bench runner."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from kcoral.runners import tool_runner
from kcoral.runners.sandboxed import ArchiveError, check_archive, safe_unpack

REPO = Path(__file__).resolve().parents[3]
JUDGE_RUNNER = REPO / "kcoral" / "workloads" / "kda" / "judge" / "runner.py"


def _load_judge_runner():
    spec = importlib.util.spec_from_file_location("_review_judge_runner", JUDGE_RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tgz(entries: list[tuple[str, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------- kcoral/runners/sandboxed.py
def test_root_directory_entries_count_towards_the_member_limit(tmp_path: Path) -> None:
    # tarfile keeps every header it reads; "./" entries must not slip past max_members.
    data = _tgz([("./", None)] * 50 + [("f.txt", b"x")])
    with pytest.raises(ArchiveError, match="more than 10 entries"):
        check_archive(data, max_members=10)
    with pytest.raises(ArchiveError, match="more than 10 entries"):
        safe_unpack(data, tmp_path, max_members=10)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- kcoral/runners/tool_runner.py
def test_collect_never_reads_through_a_link_even_if_it_appears_after_the_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_dir = tmp_path / "outside"
    secret_dir.mkdir()
    (secret_dir / "secret.txt").write_text("SECRET")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "leaf.txt").symlink_to(secret_dir / "secret.txt")
    (run_dir / "d").symlink_to(secret_dir)
    # The app's leftover children can swap a checked path for a link before it is opened:
    # simulate that window by making every os.path link check miss.
    monkeypatch.setattr(os.path, "islink", lambda p: False)
    out = tool_runner._collect(str(run_dir), ["leaf.txt", "d/secret.txt"], 1 << 20)
    assert out["files"] == {}
    assert sorted(out["refused"]) == ["d/secret.txt", "leaf.txt"]


def test_collect_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "pipe")
    (run_dir / "ok.txt").write_text("fine")
    out = tool_runner._collect(str(run_dir), ["pipe", "ok.txt"], 1 << 20)
    assert out["files"] == {"ok.txt": b"fine"} and out["refused"] == ["pipe"]


# ---------------------------------------------------------------- kcoral/workloads/kda/judge/runner.py
def test_judge_unpack_caps_the_unpacked_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _load_judge_runner()
    monkeypatch.setattr(runner, "MAX_ARCHIVE_BYTES", 4096)
    bomb = _tgz([("judge/", None), ("judge/big.bin", b"\0" * 100_000)])
    assert len(bomb) < 4096  # small on the wire, large once unpacked
    with pytest.raises(ArchiveError, match="too large"):
        runner.unpack(bomb, str(tmp_path))
    assert not (tmp_path / "judge" / "big.bin").exists()


def test_judge_unpack_refuses_links_and_escapes(tmp_path: Path) -> None:
    runner = _load_judge_runner()
    for name in ("../x", "/abs", "a\\b"):
        with pytest.raises(ArchiveError):
            runner.unpack(_tgz([(name, b"x")]), str(tmp_path))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("l")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(ArchiveError, match="link"):
        runner.unpack(buf.getvalue(), str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_judge_dies_with_the_worker_process_group(tmp_path: Path) -> None:
    """The server kills a timed-out worker's process group: the judge (and the candidate
    under it) must be in that group, not in a session of its own that outlives it."""
    pid_file = tmp_path / "judge.pid"
    archive = _tgz([
        ("judge/", None),
        ("judge/__main__.py", textwrap.dedent(f"""
            import os, time
            with open({str(pid_file)!r} + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
            time.sleep(120)
        """).encode()),
        ("workload.json", b"{}"),
        ("candidate/", None),
    ])
    (tmp_path / "bench.tgz").write_bytes(archive)
    work = tmp_path / "work"
    work.mkdir()
    driver = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("r", {str(JUDGE_RUNNER)!r})
        r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)
        r.bench(open({str(tmp_path / "bench.tgz")!r}, "rb").read(), [1], {{"timeout_s": 120}})
    """)
    worker = subprocess.Popen([sys.executable, "-c", driver], cwd=work, start_new_session=True)
    judge = None
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), "the judge never started"
        judge = int(pid_file.read_text())
        os.killpg(worker.pid, signal.SIGKILL)  # what the server does on a timeout
        worker.wait(10)
        deadline = time.monotonic() + 5
        while _alive(judge) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(judge), "the judge outlived its worker's process group"
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
        if judge is not None and _alive(judge):
            os.kill(judge, signal.SIGKILL)


def test_judge_timeout_still_kills_the_judge_and_its_children(tmp_path: Path) -> None:
    runner = _load_judge_runner()
    pid_file = tmp_path / "child.pid"
    archive = _tgz([
        ("judge/", None),
        ("judge/__main__.py", textwrap.dedent(f"""
            import subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            open({str(pid_file)!r}, "w").write(str(child.pid))
            sys.stderr.write("judge started\\n"); sys.stderr.flush()
            time.sleep(120)
        """).encode()),
        ("workload.json", b"{}"),
        ("candidate/", None),
    ])
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        t0 = time.monotonic()
        out = runner.bench(archive, [1], {"timeout_s": 2})
    finally:
        os.chdir(cwd)
    assert out["timed_out"] is True and time.monotonic() - t0 < 30
    assert "judge started" in out["log"]
    child = int(pid_file.read_text())
    try:
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
    json.dumps(out, default=str)


@pytest.mark.parametrize("judge_main", [
    b"import sys, json\nsys.stdin.read()\nprint(json.dumps({'ok': True}))\n",
    b"import time\ntime.sleep(60)\n",
])
def test_judge_runner_removes_its_directory(tmp_path: Path, judge_main: bytes) -> None:
    # A stock server may reuse its working directory: the unpacked bench must not pile up.
    runner = _load_judge_runner()
    archive = _tgz([("judge/", None), ("judge/__main__.py", judge_main),
                    ("workload.json", b"{}"), ("candidate/", None)])
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        out = runner.bench(archive, [1], {"timeout_s": 2})
        bad = runner.bench(b"not a tar", [1], {"timeout_s": 2})
    finally:
        os.chdir(cwd)
    # an unsigned report is refused (the real judge signs with the runner's one-time key)
    assert out["report"] is None and (out["timed_out"] or "unreadable" in out["runner_error"])
    assert bad["runner_error"]
    assert list(tmp_path.iterdir()) == []


def test_runner_refuses_client_device_order(tmp_path: Path) -> None:
    env, ignored = tool_runner._environment({"env": {"CUDA_DEVICE_ORDER": "FASTEST_FIRST",
                                                     "CUDA_VISIBLE_DEVICES": "5", "MODE": "x"}})
    assert sorted(ignored) == ["CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES"]
    assert env["MODE"] == "x" and env.get("CUDA_DEVICE_ORDER") != "FASTEST_FIRST"


def test_returned_files_are_not_written_through_a_local_link(tmp_path: Path) -> None:
    from kcoral.cli import write_local_files

    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "out"
    root.mkdir()
    (root / "d").symlink_to(outside)
    with pytest.raises(ArchiveError, match="symbolic link"):
        write_local_files(str(root), {"d/x.txt": b"1"})
    with pytest.raises(ArchiveError):
        write_local_files(str(root), {"../x.txt": b"1"})
    assert list(outside.iterdir()) == [] and not (tmp_path / "x.txt").exists()
    assert write_local_files(str(root), {"e/y.txt": b"2"}) == [str(root / "e" / "y.txt")]

"""The remote runner's functions, called in-process and as the uploaded bundle in a
bare interpreter (no site-packages): what a stock KCoral server would execute."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kcoral.archive import pack_directory
from kcoral.runners import bundle_source, tool_runner

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture()
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "request"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def _send(tmp_path: Path, files: dict[str, str]) -> bytes:
    src = tmp_path / "send"
    src.mkdir(exist_ok=True)
    for name, text in files.items():
        p = src / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return pack_directory(src)


def test_run_python_outputs_env_and_cleanup(tmp_path: Path, in_tmp: Path) -> None:
    archive = _send(tmp_path, {"job.py": """
        import os, sys, pathlib
        print("args", sys.argv[1:], "mode", os.environ.get("MODE"))
        print("cvd", os.environ.get("CUDA_VISIBLE_DEVICES"), file=sys.stderr)
        pathlib.Path("out").mkdir()
        pathlib.Path("out/a.txt").write_text("A")
        pathlib.Path("out/deep").mkdir()
        pathlib.Path("out/deep/b.bin").write_bytes(b"\\0\\1")
        os.symlink("/etc/passwd", "out/leak")
        pathlib.Path("single.json").write_text("{}")
        sys.exit(3)
    """})
    r = tool_runner.run_python(archive, {
        "script": "job.py", "args": ["x", "--y"], "timeout": 30,
        "env": {"MODE": "fast", "CUDA_VISIBLE_DEVICES": "7"},
        "outputs": ["out", "single.json", "nope.txt"]})
    assert r["exit_code"] == 3 and not r["timed_out"]
    assert "args ['x', '--y'] mode fast" in r["stdout"]
    assert "cvd 7" not in r["stderr"]
    assert r["ignored_env"] == ["CUDA_VISIBLE_DEVICES"]
    assert r["files"] == {"out/a.txt": b"A", "out/deep/b.bin": b"\0\1", "single.json": b"{}"}
    assert r["missing"] == ["nope.txt"] and r["refused"] == ["out/leak"]
    assert os.listdir(in_tmp) == []  # the runner's directories are gone


def test_output_path_escaping_is_refused(tmp_path: Path, in_tmp: Path) -> None:
    archive = _send(tmp_path, {"j.py": "pass\n"})
    with pytest.raises(tool_runner.RunnerError, match="bad output path"):
        tool_runner.run_python(archive, {"script": "j.py", "timeout": 10, "outputs": ["../x"]})


def test_timeout_kills_the_process_tree(tmp_path: Path, in_tmp: Path) -> None:
    archive = _send(tmp_path, {"slow.py": """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open("child.pid", "w").write(str(child.pid))
        print("started", flush=True)
        time.sleep(60)
    """})
    t = time.monotonic()
    r = tool_runner.run_python(archive, {"script": "slow.py", "timeout": 1.5,
                                         "outputs": ["child.pid"]})
    assert time.monotonic() - t < 10
    assert r["timed_out"] and r["exit_code"] < 0
    assert "started" in r["stdout"]
    pid = int(r["files"]["child.pid"])
    assert _dead(pid)


def _dead(pid: int) -> bool:
    # Gone, or a zombie waiting for whichever process adopted it to reap it.
    for _ in range(50):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_output_is_capped_keeping_head_and_tail(tmp_path: Path, in_tmp: Path) -> None:
    archive = _send(tmp_path, {"loud.py": """
        print("HEAD")
        print("x" * 100000)
        print("TAIL")
    """})
    r = tool_runner.run_python(archive, {"script": "loud.py", "timeout": 30, "output_cap": 4096})
    assert r["stdout_truncated"]
    assert r["stdout"].startswith("HEAD") and r["stdout"].rstrip().endswith("TAIL")
    assert "bytes of output dropped" in r["stdout"] and len(r["stdout"]) < 5000


def test_bad_archive_is_refused_and_leaves_nothing(in_tmp: Path) -> None:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../escape.py")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(tool_runner.RunnerError, match="refused the sent archive"):
        tool_runner.run_python(buf.getvalue(), {"script": "x.py", "timeout": 5})
    assert os.listdir(in_tmp) == []


@pytest.mark.parametrize("spec, message", [
    ({"timeout": 5}, "script"),
    ({"script": "a.py", "timeout": -1}, "timeout"),
    ({"script": "a.py", "timeout": 5, "args": "notalist"}, "args"),
    ({"script": "a.py", "timeout": 5, "env": {"A=B": "x"}}, "environment"),
])
def test_bad_spec_is_refused(in_tmp: Path, spec: dict, message: str) -> None:
    with pytest.raises(tool_runner.RunnerError, match=message):
        tool_runner.run_python(b"", spec)


def test_ncu_command_line() -> None:
    metrics = ["derived__memory_l2_theoretical_sectors_global_excessive",
               "memory_l2_theoretical_sectors_global", "gpu__time_duration.sum"]
    cmd = tool_runner.ncu_command("ncu", "/w/report.ncu-rep", ["--set", "full", "-c", "1"],
                                  metrics, ["python", "cap.py"])
    # derived__ metrics are not collectable at capture time: SourceCounters brings them.
    assert cmd == ["ncu", "--export", "/w/report.ncu-rep", "--force-overwrite",
                   "--clock-control", "none",
                   "--metrics", "memory_l2_theoretical_sectors_global,gpu__time_duration.sum",
                   "--section", "SourceCounters", "--set", "full", "-c", "1",
                   "python", "cap.py"]
    # The user's clock choice wins, the user's metrics join ours (no second --metrics),
    # and a SourceCounters section the user asked for is not repeated.
    cmd = tool_runner.ncu_command("ncu", "r", ["--clock-control", "base", "--metrics", "m2,m3",
                                               "--section", "SourceCounters"],
                                  ["m1", "m2", "derived__x"], ["app"])
    assert "none" not in cmd and cmd.count("--metrics") == 1 and cmd.count("--section") == 1
    assert cmd[cmd.index("--metrics") + 1] == "m1,m2,m3"
    # Without sector metrics there is no reason to pay for the section's replay passes.
    cmd = tool_runner.ncu_command("ncu", "r", [], ["gpu__time_duration.sum"], ["app"])
    assert "--section" not in cmd


def test_run_ncu_without_ncu_is_a_clear_failure(in_tmp: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(in_tmp))
    monkeypatch.setattr(tool_runner.glob, "glob", lambda pattern: [])
    with pytest.raises(tool_runner.RunnerError, match="ncu .* was not found on the server"):
        tool_runner.run_ncu(b"", {"app": ["true"], "timeout": 5})


def test_bundle_runs_in_a_bare_interpreter(tmp_path: Path) -> None:
    """python -I -S: no site-packages, so the bundle cannot lean on kcoral or anything else."""
    bundle = tmp_path / "bundle.py"
    bundle.write_text(bundle_source())
    archive = tmp_path / "send.tar"
    archive.write_bytes(pack_directory(FIXTURES))
    driver = textwrap.dedent(f"""
        import json, os, sys
        os.chdir({str(tmp_path)!r})
        ns = {{}}
        exec(compile(open("bundle.py").read(), "<upload>", "exec"), ns)
        data = open("send.tar", "rb").read()
        r = ns["run_iket"](data, {{"app": ["python", "make_synthetic_iket.py"], "timeout": 30}})
        assert not [m for m in sys.modules if m.startswith("kcoral.") or m == "kcoral"]
        print(json.dumps({{"exit": r["exit_code"], "traces": sorted(r["traces"]),
                          "raw": sorted(r["raw"]), "stdout": r["stdout"],
                          "trace_len": len(r["traces"].get("kda_fwd_synthetic.trace.json", b""))}}))
    """)
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", driver], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["exit"] == 0 and "synthetic IKET pair written" in out["stdout"]
    assert out["traces"] == ["kda_fwd_synthetic.trace.json"]
    assert out["raw"] == ["kda_fwd_synthetic.iket.bin", "kda_fwd_synthetic.iket.json"]
    assert out["trace_len"] > 10000


def test_iket_conversion_error_is_reported_per_kernel(tmp_path: Path, in_tmp: Path) -> None:
    archive = _send(tmp_path, {"app.py": """
        import os
        d = os.environ["IKET_OUT"]
        open(os.path.join(d, "bad.iket.bin"), "wb").write(b"short")
        open(os.path.join(d, "bad.iket.json"), "w").write('{"kernel": "bad"}')
        open(os.path.join(d, "alone.iket.bin"), "wb").write(b"")
    """})
    r = tool_runner.run_iket(archive, {"app": ["python", "app.py"], "timeout": 30})
    assert r["traces"] == {} and "shorter than its 16-byte header" in r["errors"]["bad"]
    assert r["unpaired"] == ["alone.iket.bin"]

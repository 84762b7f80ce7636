"""`kcoral python` and `kcoral.remote.run_python` against a real server process."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kcoral import Program
from kcoral.cli import EXIT_TIMEOUT, EXIT_USAGE, main
from kcoral.errors import ToolInputError
from kcoral.remote import SendSpec, run_python
from kcoral.runners import bundle_source


def _dir(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def test_exit_status_output_and_env(url: str, tmp_path: Path, monkeypatch, capsys) -> None:
    d = _dir(tmp_path / "job", {"job.py": """
        import os, sys
        print("hello from", os.path.basename(sys.executable), sys.argv[1:])
        print("MODE", os.environ.get("MODE"), "LOCALVAR", os.environ.get("LOCALVAR"))
        print("to stderr", file=sys.stderr)
        sys.exit(7)
    """})
    monkeypatch.setenv("LOCALVAR", "from-here")
    code = main(["python", "--remote", url, "--send", str(d), "-e", "MODE=fast",
                 "-e", "LOCALVAR", "--", "job.py", "a", "b c"])
    out, err = capsys.readouterr()
    assert code == 7
    assert "hello from python" in out and "['a', 'b c']" in out
    assert "MODE fast LOCALVAR from-here" in out
    assert "to stderr" in err


def test_console_entry_point_propagates_status(url: str, tmp_path: Path) -> None:
    d = _dir(tmp_path / "ok", {"ok.py": "print('fine')\nraise SystemExit(0)\n",
                               "bad.py": "raise SystemExit(42)\n"})
    for script, expected in (("ok.py", 0), ("bad.py", 42)):
        proc = subprocess.run([sys.executable, "-m", "kcoral.cli", "python", "--remote", url,
                               "--send", str(d), "--", script], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == expected, proc.stderr
    assert "fine" in subprocess.run(
        [sys.executable, "-m", "kcoral.cli", "python", "--remote", url, "--send", str(d), "--",
         "ok.py"], capture_output=True, text=True, timeout=120).stdout


def test_send_layout_and_output_files(url: str, tmp_path: Path, capsys) -> None:
    a = _dir(tmp_path / "cand", {"main.py": """
        import os, pathlib, json
        tree = sorted(os.path.join(r, f) for r, _, fs in os.walk(".") for f in fs)
        print("\\n".join(tree))
        pathlib.Path("results").mkdir()
        pathlib.Path("results/r.json").write_text(json.dumps({"ok": True}))
        pathlib.Path("results/sub").mkdir()
        pathlib.Path("results/sub/log.txt").write_text("log")
        pathlib.Path("top.bin").write_bytes(bytes(range(256)))
    """, "pkg/util.py": "X = 1\n"})
    b = _dir(tmp_path / "judge", {"judge.py": "J = 2\n"})
    dest = tmp_path / "back"
    code = main(["python", "--remote", url, "--send", str(a), "--send", f"{b}:lib/judge",
                 "-o", "results", "-o", "top.bin", "-o", "never.txt", "--output-dir", str(dest),
                 "--", "main.py"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.split() == ["./lib/judge/judge.py", "./main.py", "./pkg/util.py"]
    assert (dest / "results/r.json").read_text() == '{"ok": true}'
    assert (dest / "results/sub/log.txt").read_text() == "log"
    assert (dest / "top.bin").read_bytes() == bytes(range(256))
    assert "produced no never.txt" in err


def test_library_result_and_timings(client, tmp_path: Path) -> None:
    d = _dir(tmp_path / "lib", {"t.py": "import os; open('o.txt','w').write(os.environ['CASES'])\n"})
    r = run_python(client, [SendSpec(d)], "t.py", env={"CASES": "all"}, timeout=60,
                   outputs=["o.txt"])
    assert (r.exit_code, r.files) == (0, {"o.txt": b"all"})
    assert r.outcome is not None and r.outcome.status == "COMPLETED" and r.outcome.request_id
    assert r.outcome.elapsed_ms > 0


def test_cuda_visible_devices_is_refused_by_the_client(url: str, tmp_path: Path, capsys) -> None:
    d = _dir(tmp_path / "c", {"x.py": "pass\n"})
    assert main(["python", "--remote", url, "--send", str(d), "-e", "CUDA_VISIBLE_DEVICES=3",
                 "--", "x.py"]) == EXIT_USAGE
    assert "CUDA_VISIBLE_DEVICES cannot be set" in capsys.readouterr().err


def test_cuda_visible_devices_is_ignored_by_the_runner(client, tmp_path: Path) -> None:
    # A program built by hand (not through kcoral.remote) still cannot pick the GPU.
    from kcoral.archive import pack_directory

    d = _dir(tmp_path / "g", {"g.py": "import os; print('CVD=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"})
    p = Program()
    mod = p.upload(kind="module", source=bundle_source())
    fn = p.get_function(module=mod, name="run_python")
    data = p.upload(kind="bytes", value=pack_directory(d))
    out = p.run(fn=fn, args=[data, {"script": "g.py", "timeout": 30,
                                     "env": {"CUDA_VISIBLE_DEVICES": "7"}}])
    p.return_(key="r", value=out)
    r = client.execute(p, timeout_seconds=60).raise_for_failure().results["r"]
    assert r["ignored_env"] == ["CUDA_VISIBLE_DEVICES"]
    assert "CVD='7'" not in r["stdout"] and "CVD=" in r["stdout"]


def test_timeout_gives_124_and_the_output_so_far(url: str, tmp_path: Path, capsys) -> None:
    d = _dir(tmp_path / "s", {"s.py": "import time\nprint('begun', flush=True)\ntime.sleep(60)\n"})
    t = time.monotonic()
    code = main(["python", "--remote", url, "--send", str(d), "--timeout", "4", "--", "s.py"])
    out, err = capsys.readouterr()
    assert code == EXIT_TIMEOUT and time.monotonic() - t < 30
    assert "begun" in out and "ran past its time limit" in err


def test_remote_failure_is_reported_with_its_kind(client, tmp_path: Path) -> None:
    p = Program()
    mod = p.upload(kind="module", source=bundle_source())
    fn = p.get_function(module=mod, name="run_python")
    data = p.upload(kind="bytes", value=b"not an archive" * 10)
    p.return_(key="r", value=p.run(fn=fn, args=[data, {"script": "x.py", "timeout": 10}]))
    outcome = client.execute(p, timeout_seconds=30)
    assert outcome.status == "FAILED"
    assert "refused the sent archive" in outcome.error.message


def test_library_refuses_bad_input_before_sending(client, tmp_path: Path) -> None:
    with pytest.raises(ToolInputError, match="'..'"):
        run_python(client, [], "x.py", outputs=["../etc/passwd"])
    with pytest.raises(ToolInputError, match="CUDA_VISIBLE_DEVICES"):
        run_python(client, [], "x.py", env={"CUDA_VISIBLE_DEVICES": "0"})


def test_status_shows_load_while_a_request_runs(url: str, client, tmp_path: Path, capsys) -> None:
    assert main(["status", "--remote", url]) == 0
    idle = capsys.readouterr().out
    assert idle.startswith("load=0 ") and "workers=0/2 busy" in idle
    d = _dir(tmp_path / "w", {"w.py": "import time; time.sleep(4)\n"})
    worker = threading.Thread(target=run_python, args=(client, [SendSpec(d)], "w.py"),
                              kwargs={"timeout": 60})
    worker.start()
    try:
        seen = ""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "load=1 " not in seen:
            assert main(["status", "--remote", url]) == 0
            seen = capsys.readouterr().out
            time.sleep(0.2)
        assert "load=1 " in seen and "workers=1/2 busy" in seen
    finally:
        worker.join(timeout=60)
    assert main(["status", "--remote", url, "--json"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["status"] == "ok"

"""scripts/gpu-host.sh, run for real on a CPU server (GPUS empty, the CPU twin of the KDA
workload, the NumPy family): it renders the points, starts its own server, benches each
point officially and stops the server when it ends; it refuses a taken port and a point the
family does not admit before it starts anything."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.embedded import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-host.sh"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the server's sandbox needs bubblewrap")


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


def _run(tmp_path: Path, port: int, *args: str, timeout: float = 600,
         family: str = "numpy_chunked") -> subprocess.CompletedProcess[str]:
    # OUT relative: the caller's directory, not the checkout the script changes to
    env = dict(os.environ, GPUS="", WORKLOAD="forward_cpu_small", FAMILY=family, OUT="out",
               PORT=str(port), CPU_WORKERS="1", BENCH_TIMEOUT="300",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")   # this interpreter as python3
    env.pop("KCORAL_REMOTE", None)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path)


def test_benches_each_point_on_its_own_server_and_stops_it(tmp_path):
    port = free_port()
    # FAMILY names a GPU family: the points name theirs (FAMILY/NAME), so they render as the CPU one
    res = _run(tmp_path, port, "bench", "numpy_chunked/seed", "numpy_chunked/f32:dtype=float32,chunk=32",
               family="two_pass")
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "out"
    assert not (REPO / "out").exists()
    assert (out / "salt").stat().st_mode & 0o077 == 0   # the holdout salt: the operator's alone
    reports = {p.name: json.loads(p.read_text()) for p in sorted(out.glob("bench-*.json"))}
    assert sorted(reports) == ["bench-1-seed.json", "bench-2-f32.json"]
    for name, rep in reports.items():
        assert rep["passed"] is True, (name, rep["failure_kind"], rep["message"][:500])
        assert rep["kernel_ms"] > 0 and rep["baseline_ms"] > 0
        assert name.split("-")[2].removesuffix(".json") in res.stdout   # a line each
    rendered = {json.loads((p / "params.json").read_text())["params"]["dtype"]
                for p in (out / "points").iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert rendered == {"float64", "float32"}
    assert not _listening(port)   # its server went with it


def test_refuses_a_taken_port_before_starting_anything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        res = _run(tmp_path, taken.getsockname()[1], "bench", "seed", timeout=120)
    assert res.returncode == 1
    assert "is taken" in res.stderr
    assert not (tmp_path / "out" / "server.log").exists()


@pytest.mark.parametrize("point, says", [
    ("bad:chunk=7", "chunk=7 is not one of"),   # a value the family does not admit
    ("nosuch/x", "no family 'nosuch'"),         # a family it does not know
])
def test_refuses_a_point_it_cannot_render(tmp_path, point, says):
    port = free_port()
    res = _run(tmp_path, port, "bench", "seed", point, timeout=120)
    assert res.returncode == 1
    assert says in res.stderr and f"point {point}: not rendered" in res.stderr
    assert not (tmp_path / "out" / "server.log").exists()
    assert not _listening(port)


def test_refuses_a_point_name_that_cannot_name_its_report(tmp_path):
    # the first '/' ends the family's name; a second one would land in the report's path
    res = _run(tmp_path, free_port(), "bench", "numpy_chunked/a/b:chunk=32", timeout=120)
    assert res.returncode == 1 and "name it with letters" in res.stderr
    assert not (tmp_path / "out" / "server.log").exists()


@pytest.mark.skipif(shutil.which("flock") is None, reason="the script's lock needs flock (util-linux)")
def test_refuses_an_out_folder_another_run_is_using(tmp_path):
    (tmp_path / "out").mkdir()
    with open(tmp_path / "out" / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = _run(tmp_path, free_port(), "bench", "seed", timeout=120)
    assert res.returncode == 1 and "another gpu-host.sh is using" in res.stderr
    assert not (tmp_path / "out" / "server.log").exists()

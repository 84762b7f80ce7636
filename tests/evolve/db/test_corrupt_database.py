"""A corrupted SQLite file given to any evolve command gets one clear line (what, which
file, what to do) and a non-zero exit, never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.db import open_database
from evolve.population import Population

from .conftest import populate

REPO = Path(__file__).resolve().parents[3]


def _evolve(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EVOLVE_DB", None)
    env.pop("KCORAL_REMOTE", None)
    return subprocess.run([sys.executable, "-m", "evolve.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def broken_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("corrupt")
    good = d / "good.db"
    db = open_database(f"sqlite:///{good}")  # created and migrated by Alembic
    pop = Population(db)
    populate(pop, pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small"))
    db.close()
    data = good.read_bytes()
    files = {"random": d / "random.db", "truncated": d / "truncated.db", "torn_header": d / "torn.db"}
    files["random"].write_bytes(os.urandom(64 << 10))
    files["truncated"].write_bytes(data[: len(data) // 2])
    files["torn_header"].write_bytes(data[:50])
    return files


def _commands(tmp: Path) -> list[list[str]]:
    cand = tmp / "cand"
    cand.mkdir(exist_ok=True)
    (cand / "solution.py").write_text("def setup(data, B, T, H):\n    return None\n")
    return [["run", "kda-cpu-small", "--max-evals", "1"],
            ["register", str(cand), "--workload", "forward_cpu_small"],
            ["evaluate", "1"], ["leaderboard"], ["show", "1"], ["status"],
            ["report", "--out", str(tmp / "report.html")], ["db", "upgrade"], ["db", "current"]]


@pytest.mark.parametrize("kind", ["random", "truncated", "torn_header"])
def test_every_command_explains_a_corrupted_database_in_one_line(tmp_path: Path, broken_files, kind: str) -> None:
    path = broken_files[kind]
    before = path.read_bytes()
    for args in _commands(tmp_path):
        r = _evolve(tmp_path, *args, "--db", str(path))
        what = f"evolve {' '.join(args[:2])} on a {kind} file"
        assert r.returncode == 2, f"{what}: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert "Traceback" not in r.stderr, f"{what}:\n{r.stderr[-2000:]}"
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, f"{what}:\n{r.stderr}"
        line = lines[0]
        assert line.startswith("evolve: the database file ") and str(path) in line, line
        assert "is not a readable SQLite database" in line and "evolve db upgrade" in line, line
        assert "embedded server" not in r.stdout + r.stderr
    assert path.read_bytes() == before, "a command changed the corrupted file"

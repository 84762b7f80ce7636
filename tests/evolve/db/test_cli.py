"""The read-side commands and `register`: each once as a real subprocess
(`python -m evolve.cli ...`), their variants in-process through `evolve.cli.main` (a
subprocess costs a second of imports on a small machine)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from evolve.cli import main
from evolve.db import open_database
from evolve.db.migrate import head_revision
from evolve.population import Population

from .conftest import populate

REPO = Path(__file__).resolve().parents[3]


def evolve(cwd: Path, *args: str, env_db: str | None = None) -> subprocess.CompletedProcess[str]:
    # $EVOLVE_DB as the test left it: the `cli` fixture clears it, `demo` names its database.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if env_db:
        env["EVOLVE_DB"] = env_db
    return subprocess.run(
        [sys.executable, "-m", "evolve.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run `evolve ARGS` in this process with tmp_path as the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EVOLVE_DB", raising=False)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return run


@pytest.fixture
def demo(tmp_path: Path, db_url: str, backend: str, cli, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, int]]:  # type: ignore[no-untyped-def]
    """A populated database that commands find without --db: evolve.db in tmp_path (the
    default location), or a PostgreSQL database named by $EVOLVE_DB."""
    if backend != "sqlite":
        monkeypatch.setenv("EVOLVE_DB", db_url)
    db = open_database(db_url)
    pop = Population(db)
    ids = populate(pop, pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small"))
    db.close()
    return tmp_path, ids


@pytest.fixture
def sqlite_demo(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """A populated evolve.db in tmp_path (the default database location)."""
    db = open_database(f"sqlite:///{tmp_path / 'evolve.db'}")
    pop = Population(db)
    ids = populate(pop, pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small"))
    db.close()
    return tmp_path, ids


def test_register_infers_workload_dedups_and_refuses_links(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    scratch = tmp_path / "kcoral" / "workloads" / "kda" / "fw_small" / "scratch"
    exp = scratch / "overlap"
    exp.mkdir(parents=True)
    (exp / "solution.py").write_text("def setup(data, B, T, H):\n    return lambda: None\n")
    (exp / "__pycache__").mkdir()
    (exp / "__pycache__" / "solution.cpython-311.pyc").write_bytes(b"\0junk")
    first = evolve(tmp_path, "register", str(exp), "--author", "agent-7", "--notes", "overlap the tail")
    assert first.returncode == 0, first.stderr
    cid = int(first.stdout.strip())
    copy = scratch / "overlap-copy"
    copy.mkdir()
    (copy / "solution.py").write_text((exp / "solution.py").read_text())
    again = cli("register", "kcoral/workloads/kda/fw_small/scratch/overlap-copy")
    assert again.returncode == 0 and int(again.stdout.strip()) == cid
    assert "already registered" in again.stderr
    pop = Population.open(f"sqlite:///{tmp_path / 'evolve.db'}")
    cand = pop.candidate(cid)
    assert cand is not None and cand.origin == "agent" and cand.author == "agent-7" and cand.name == "overlap"
    assert cand.directory == "kcoral/workloads/kda/fw_small/scratch/overlap"
    assert pop.workload("fw_small").path == "kcoral/workloads/kda/fw_small"  # type: ignore[union-attr]
    (copy / "helper.py").symlink_to(exp / "solution.py")
    linked = cli("register", str(copy))
    assert linked.returncode == 2 and "symbolic link" in linked.stderr
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "solution.py").write_text("x = 1\n")
    assert "--workload" in cli("register", str(outside)).stderr
    ok = cli("register", str(outside), "--workload", "fw_small", "--name", "loose")
    assert ok.returncode == 0 and int(ok.stdout) != cid
    missing = cli("register", str(tmp_path), "--workload", "fw_small")
    assert missing.returncode == 2 and "solution.py" in missing.stderr


def test_leaderboard_command(demo: tuple[Path, dict[str, int]], cli) -> None:  # type: ignore[no-untyped-def]
    cwd, ids = demo
    table = evolve(cwd, "leaderboard")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[2].split()[1] == str(ids["fast"]) and "✓" in lines[2]
    as_json = json.loads(cli("leaderboard", "--json", "--limit", "2").stdout)
    assert [r["candidate_id"] for r in as_json] == [ids["fast"], ids["seed"]]  # confirmed first
    unknown = cli("leaderboard", "--workload", "nope")
    assert unknown.returncode == 2 and "nope" in unknown.stderr


def test_show_command(demo: tuple[Path, dict[str, int]], cli) -> None:  # type: ignore[no-untyped-def]
    cwd, ids = demo
    out = evolve(cwd, "show", str(ids["broken"]))
    assert out.returncode == 0, out.stderr
    assert "failed (compile)" in out.stdout and "identifier undefined" in out.stdout and "nvcc failed" in out.stdout
    assert f"^ {ids['fast']}" in out.stdout and f"^ {ids['seed']}" in out.stdout
    by_dir = cli("show", "kcoral/workloads/kda/forward_cpu_small/gen/fast", "--json")
    doc = json.loads(by_dir.stdout)
    assert doc["candidate"]["id"] == ids["fast"]
    assert [e["stage"] for e in doc["evaluations"]] == ["check", "bench", "ncu", "confirm"]
    assert [c["id"] for c in doc["children"]] == [ids["broken"]]
    assert cli("show", "9999").returncode == 1


def test_status_and_report_commands(demo: tuple[Path, dict[str, int]], cli) -> None:  # type: ignore[no-untyped-def]
    cwd, ids = demo
    status = evolve(cwd, "status")
    assert status.returncode == 0, status.stderr
    assert "failed/compile=1" in status.stdout
    assert "3 candidate(s) benched and 10 stage(s) finished" in status.stdout
    assert "GPU lease held by its finished stages 3 s" in status.stdout
    assert f"candidate {ids['fast']}" in status.stdout.split("confirmed best:")[1]
    report = cli("report", "--out", "r.html", "--workload", "forward_cpu_small")
    assert report.returncode == 0, report.stderr
    page = (cwd / "r.html").read_text()
    assert "<svg" in page and "<table>" in page


def test_db_commands_and_version_refusal(tmp_path: Path, empty_db_url: str, cli) -> None:  # type: ignore[no-untyped-def]
    url = empty_db_url
    assert cli("db", "current", "--db", url).returncode == 1
    up = evolve(tmp_path, "db", "upgrade", "--db", url)
    assert up.returncode == 0 and f"-> {head_revision()}" in up.stdout
    assert cli("db", "current", "--db", url).returncode == 0
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'abcdef99'"))
    engine.dispose()
    refused = evolve(tmp_path, "leaderboard", env_db=url)
    assert refused.returncode == 2 and "evolve db upgrade" in refused.stderr
    newer = cli("db", "upgrade", "--db", url)  # a revision from a newer evolve: not touched
    assert newer.returncode == 2 and "newer evolve" in newer.stderr
    assert cli("db", "current", "--db", url).returncode == 1


def test_db_takes_a_plain_file_path(sqlite_demo, cli) -> None:  # type: ignore[no-untyped-def]
    """`--db some/file.db` is the SQLite database at that path, relative or absolute, the
    same one its sqlite:/// URL names (a path used to fail as an unparseable URL)."""
    root, ids = sqlite_demo
    by_url = cli("leaderboard", "--json", "--db", f"sqlite:///{root / 'evolve.db'}")
    by_path = cli("leaderboard", "--json", "--db", str(root / "evolve.db"))
    by_relative = cli("leaderboard", "--json", "--db", "evolve.db")
    assert by_url.returncode == by_path.returncode == by_relative.returncode == 0, by_path.stderr
    assert json.loads(by_path.stdout) == json.loads(by_url.stdout) == json.loads(by_relative.stdout)
    assert json.loads(by_path.stdout), "the populated database has a leaderboard"
    fresh = root / "sub" / "new.db"
    fresh.parent.mkdir()
    assert cli("status", "--db", str(fresh)).returncode == 0
    assert fresh.exists()   # created and migrated at that path, not read as a URL


def test_db_path_keeps_url_characters_and_memory() -> None:
    """A path with `?` or `#` names that file (not a URL query); `:memory:` stays in memory."""
    from evolve.db.engine import as_url

    odd = as_url("runs/a?b#c.db")
    assert odd.get_backend_name() == "sqlite" and odd.database.endswith("runs/a?b#c.db") and not odd.query
    assert as_url(":memory:").database is None
    assert as_url("sqlite:///x.db").database == "x.db"


def test_every_read_and_write_command_speaks_json(demo: tuple[Path, dict[str, int]], cli) -> None:  # type: ignore[no-untyped-def]
    cwd, ids = demo
    exp = cwd / "kcoral" / "workloads" / "kda" / "forward_cpu_small" / "scratch" / "idea"
    exp.mkdir(parents=True)
    (exp / "solution.py").write_text("def setup(data, B, T, H):\n    return lambda: None\n")
    registered = json.loads(cli("register", str(exp), "--json").stdout)
    assert registered["created"] is True and isinstance(registered["candidate_id"], int)
    status = json.loads(cli("status", "--json").stdout)
    assert status["runs"][0]["id"] == ids["run"] and status["best"][0]["candidate_id"] == ids["fast"]
    assert any(c["stage"] == "check" for c in status["evaluations"])
    report = json.loads(cli("report", "--out", str(cwd / "r.html"), "--json").stdout)
    assert report["out"].endswith("r.html") and report["bytes"] > 1000
    current = json.loads(cli("db", "current", "--json").stdout)
    assert current["up_to_date"] is True and current["revision"] == current["head"]
    upgraded = json.loads(cli("db", "upgrade", "--json").stdout)
    assert upgraded["before"] == upgraded["after"] == current["head"]
    assert json.loads(cli("leaderboard", "--json").stdout)[0]["candidate_id"] == ids["fast"]
    assert json.loads(cli("show", str(ids["fast"]), "--json").stdout)["candidate"]["id"] == ids["fast"]


def test_an_unreachable_database_server_is_one_line_without_the_password(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    """Nothing listens on port 9 of loopback: every command says so in one line, exit 2."""
    url = "postgresql+psycopg://evolve:s3cret@127.0.0.1:9/evolve"
    for args in (("leaderboard",), ("status",), ("db", "upgrade")):
        r = cli(*args, "--db", url)
        assert r.returncode == 2, r.stderr
        assert "unreachable" in r.stderr and "127.0.0.1:9" in r.stderr and "s3cret" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_leaderboard_keeps_to_one_card_when_asked_and_warns_when_mixed(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    from evolve.population import StageResult

    from .conftest import finish, make_candidate

    db = open_database(f"sqlite:///{tmp_path / 'evolve.db'}")
    pop = Population(db)
    wid = pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small")
    ids = {}
    for name, speedup, card in (("h200_a", 3.31, "NVIDIA H200"), ("h100", 3.20, "NVIDIA H100 80GB HBM3"),
                                ("h200_b", 3.10, "NVIDIA H200")):
        ids[name] = make_candidate(pop, wid, name)
        finish(pop, ids[name], "bench", StageResult(status="passed", speedup=speedup, metrics={"device": card}))
    db.close()
    mixed = cli("leaderboard", "--json")
    assert mixed.returncode == 0 and "2 kinds of card" in mixed.stderr and "H100 80GB HBM3" in mixed.stderr
    assert len(json.loads(mixed.stdout)) == 3
    h200 = cli("leaderboard", "--card", "h200", "--json")
    rows = json.loads(h200.stdout)
    assert [(r["candidate_id"], r["rank"]) for r in rows] == [(ids["h200_a"], 1), (ids["h200_b"], 2)]
    assert "kinds of card" not in h200.stderr
    one = cli("leaderboard", "--card", "H100", "--limit", "1")
    assert one.returncode == 0 and "h100" in one.stdout and "h200" not in one.stdout

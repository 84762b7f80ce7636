"""Several processes on one database (SQLite file or PostgreSQL): claims are exclusive and
writers lose nothing."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from evolve.population import Population

from . import _workers
from .conftest import make_candidate

REPO = Path(__file__).resolve().parents[3]


def test_begin_stage_race_has_exactly_one_winner(db_url: str, pop: Population, workload: int) -> None:
    ids = [make_candidate(pop, workload, f"d{i}") for i in range(20)]
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=_workers.claim, args=(db_url, ids, "gputest", start, results)) for _ in range(3)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # let them import and open the database
    start.set()
    won = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    claimed = sorted(cid for batch in won for cid in batch)
    assert claimed == ids  # every candidate claimed exactly once, by one process
    for cid in ids:
        rows = pop.evaluations(cid, stage="gputest")
        assert len(rows) == 1 and rows[0].status == "running"


def _scratch(root: Path, name: str, body: str) -> Path:
    d = root / "kcoral" / "workloads" / "kda" / "forward_cpu_small" / "scratch" / name
    d.mkdir(parents=True)
    (d / "solution.py").write_text(body)
    return d


def test_concurrent_registers_and_a_busy_writer_lose_nothing(tmp_path: Path, db_url: str, pop: Population, workload: int) -> None:
    target = make_candidate(pop, workload, "busy")
    stop, count_file = tmp_path / "stop", tmp_path / "count"
    ctx = multiprocessing.get_context("spawn")
    writer = ctx.Process(target=_workers.write_evaluations, args=(db_url, target, str(stop), str(count_file)))
    writer.start()
    dirs = [_scratch(tmp_path, f"exp{i}", f"# experiment {i}\n") for i in range(4)]
    env = {**os.environ, "EVOLVE_DB": db_url, "PYTHONPATH": str(REPO)}
    regs = [
        subprocess.Popen(
            [sys.executable, "-m", "evolve.cli", "register", str(d), "--author", "agent-7"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for d in dirs
    ]
    outputs = [p.communicate(timeout=120) for p in regs]
    stop.touch()
    writer.join(timeout=60)
    assert writer.exitcode == 0
    for (_, err), p in zip(outputs, regs):
        assert p.returncode == 0, err
        assert "locked" not in err
    printed = sorted(int(out.split()[0]) for out, _ in outputs)
    stored = pop.candidates(workload)
    assert sorted(c.id for c in stored if c.origin == "agent") == printed and len(printed) == 4
    written = int(count_file.read_text())
    assert written > 0
    rows = pop.evaluations(target, stage="confirm")
    assert len(rows) == written and all(r.status == "passed" for r in rows)
    assert [r.attempt for r in rows] == list(range(1, written + 1))


def test_processes_racing_to_create_a_fresh_database(empty_db_url: str) -> None:
    url = empty_db_url
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=_workers.open_fresh, args=(url, f"w{i}", start, results)) for i in range(3)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    start.set()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [o[0] for o in outcomes] == ["ok"] * 3, outcomes
    pop = Population.open(url)
    assert sorted(w.name for w in pop.workloads()) == ["w0", "w1", "w2"]

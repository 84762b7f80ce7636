from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evolve.db import Database, open_database
from evolve.population import NewCandidate, Population, StageResult


BACKENDS = ("sqlite", "postgresql")
_databases = itertools.count(1)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every population test runs on both: the embedded SQLite file and a shared PostgreSQL."""
    return str(request.param)


@pytest.fixture(scope="session")
def pg_template(postgres: Any) -> str:
    """A database migrated once per session; each test gets a copy (CREATE DATABASE ...
    TEMPLATE is a file copy, several times faster than running the migrations again)."""
    url = postgres.create_database("evolve_template")
    open_database(url).close()
    return "evolve_template"


@pytest.fixture
def empty_db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database with nothing in it (not even evolve's schema)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'evolve.db'}"
    postgres = request.getfixturevalue("postgres")
    return str(postgres.create_database(f"empty_{next(_databases)}"))


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database for the population: a SQLite file (migrated when first opened) or a
    PostgreSQL database already at the current schema."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'evolve.db'}"
    postgres = request.getfixturevalue("postgres")
    template = request.getfixturevalue("pg_template")
    return str(postgres.create_database(f"t_{next(_databases)}", template=template))


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    yield database
    database.close()


@pytest.fixture
def pop(db: Database) -> Population:
    return Population(db)


@pytest.fixture
def workload(pop: Population) -> int:
    return pop.ensure_workload(name="forward_cpu_small", path="candidates/kda/forward_cpu_small")


def make_candidate(pop: Population, workload_id: int, digest: str, **fields: object) -> int:
    fields.setdefault("origin", "template")
    fields.setdefault("directory", f"candidates/kda/forward_cpu_small/gen/{digest}")
    cand, _ = pop.add_candidate(NewCandidate(workload_id=workload_id, digest=digest, **fields))  # type: ignore[arg-type]
    return cand.id


def finish(pop: Population, candidate_id: int, stage: str, result: StageResult, run_id: int | None = None) -> int:
    eid = pop.begin_stage(candidate_id, stage, run_id=run_id)
    assert eid is not None
    assert pop.finish_stage(eid, result)
    return eid


def populate(pop: Population, workload_id: int) -> dict[str, int]:
    """A small search: a seed, two children, a failure, a promotion chain."""
    run = pop.start_run(workload_id, {"strategy": "evolution"}, "evolution")
    seed = make_candidate(pop, workload_id, "seed", origin="seed", name="seed", run_id=run)
    fast = make_candidate(pop, workload_id, "fast", family="two_pass", params={"chunk": 64}, parents=[seed],
                          generation=1, operator="mutate", run_id=run)
    slow = make_candidate(pop, workload_id, "slow", origin="agent", author="agent-7", name="slow-exp")
    broken = make_candidate(pop, workload_id, "broken", family="two_pass", parents=[fast, seed], generation=2,
                            operator="crossover", run_id=run)
    for cid, speedup, ms in ((seed, 1.0, 2.0), (fast, 3.0, 0.667), (slow, 1.5, 1.333)):
        finish(pop, cid, "check", StageResult(status="passed", registers=96, spills=0), run)
        finish(pop, cid, "bench", StageResult(status="passed", ms=ms, baseline_ms=2.0, speedup=speedup, spread=0.01,
                                              queue_ms=12.0, lease_held_ms=900.0, gpu="0"), run)
    finish(pop, fast, "ncu", StageResult(status="passed", excessive_sectors=6144), run)
    finish(pop, broken, "check", StageResult(status="failed", failure_kind="compile",
                                             message="kda_prep.cu(12): error: identifier undefined",
                                             metrics={"stderr_tail": "nvcc failed\nline two"}), run)
    c1 = finish(pop, seed, "confirm", StageResult(status="passed", speedup=1.0), run)
    pop.promote(seed, None, [c1], margin=0.02, speedup_over_best=None)
    c2 = finish(pop, fast, "confirm", StageResult(status="passed", speedup=2.9), run)
    pop.promote(fast, seed, [c2], margin=0.02, speedup_over_best=2.9)
    return {"run": run, "seed": seed, "fast": fast, "slow": slow, "broken": broken}

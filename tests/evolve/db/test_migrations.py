from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from evolve.db import Database, SchemaVersionError, open_database
from evolve.db.engine import create_evolve_engine
from evolve.db.migrate import alembic_config, current_revision, head_revision, upgrade
from evolve.db.models import Base
from evolve.population import Population

TABLES = {
    "workloads",
    "runs",
    "candidates",
    "candidate_parents",
    "evaluations",
    "evaluation_logs",
    "promotions",
    "promotion_confirmations",
    "run_workers",
    "alembic_version",
}


def test_empty_database_is_migrated_to_head(empty_db_url: str) -> None:
    db_url = empty_db_url
    db = open_database(db_url)
    try:
        with db.engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) == TABLES
            assert current_revision(conn) == head_revision()
            if conn.dialect.name == "sqlite":
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            # The migration and the ORM models describe the same schema.
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        db.close()
    open_database(db_url).close()  # a second open of a current database is accepted


def test_future_revision_is_refused_naming_the_upgrade_command(empty_db_url: str) -> None:
    db_url = empty_db_url
    open_database(db_url).close()
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeed'"))
    engine.dispose()
    with pytest.raises(SchemaVersionError) as err:
        open_database(db_url)
    assert "evolve db upgrade" in str(err.value)
    assert "f00dfeed" in str(err.value)


def test_downgrade_to_base_then_upgrade_restores_the_schema(empty_db_url: str) -> None:
    db_url = empty_db_url
    db = open_database(db_url)
    with db.write_connection() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
        assert set(inspect(conn).get_table_names()) == {"alembic_version"}
    before, after = upgrade(db)
    assert before is None and after == head_revision()
    with db.engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) == TABLES
    db.close()
    open_database(db_url).close()


def test_older_schema_is_refused_then_upgraded_with_its_data(empty_db_url: str) -> None:
    db_url = empty_db_url
    db = Database.from_engine(create_evolve_engine(db_url))
    upgrade(db, "0001")
    with db.write_connection() as conn:
        conn.execute(text("INSERT INTO workloads (id, name, path, created_at) VALUES (1, 'w', 'p', '2026-01-01 00:00:00')"))
        for cid, digest in ((1, "a"), (2, "b"), (3, "waiting")):   # 3: registered, never evaluated
            conn.execute(
                text(
                    "INSERT INTO candidates (id, workload_id, origin, params, digest, directory, generation, created_at)"
                    " VALUES (:id, 1, 'seed', '{}', :d, :dir, 0, '2026-01-01 00:00:00')"
                ),
                {"id": cid, "d": digest, "dir": digest},
            )
        for cid, attempt, status, speedup in ((1, 1, "passed", 1.5), (1, 2, "failed", 9.0), (2, 1, "passed", 2.5)):
            conn.execute(
                text(
                    "INSERT INTO evaluations (candidate_id, stage, attempt, status, message, metrics, started_at, speedup,"
                    " failure_kind) VALUES (:c, 'bench', :a, :s, '', '{}', '2026-01-01 00:00:00', :x, :k)"
                ),
                {"c": cid, "a": attempt, "s": status, "x": speedup, "k": "timeout" if status == "failed" else None},
            )
    db.close()
    with pytest.raises(SchemaVersionError) as err:
        open_database(db_url)
    assert "'0001'" in str(err.value) and "evolve db upgrade --db" in str(err.value)
    db = Database.from_engine(create_evolve_engine(db_url))
    assert upgrade(db) == ("0001", head_revision())
    db.close()
    pop = Population.open(db_url)
    assert [(r.candidate_id, r.speedup) for r in pop.leaderboard()] == [(2, 2.5), (1, 1.5)]
    # 0004 backfilled claimed_at: only the never-evaluated candidate is handed out as waiting.
    claim = pop.claim_next(1, "check")
    assert claim is not None and claim[0].id == 3
    assert pop.claim_next(1, "check") is None
    pop.close()


def test_foreign_tables_without_revision_are_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'other.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE notes (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(SchemaVersionError, match="no evolve schema revision"):
        open_database(url)


def test_0003_adds_stage_logs_that_a_finished_stage_fills(empty_db_url: str) -> None:
    db_url = empty_db_url
    from evolve.population import NewCandidate, StageLogs, StageResult

    db = Database.from_engine(create_evolve_engine(db_url))
    upgrade(db, "0002")
    assert upgrade(db) == ("0002", head_revision())
    db.close()
    pop = Population.open(db_url)
    wid = pop.ensure_workload("w", "p")
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest="d", directory="d"))
    eid = pop.begin_stage(cand.id, "gputest")
    assert eid is not None
    logs = StageLogs(stdout="out\n", stderr="Traceback (most recent call last):\nValueError: x\n",
                     traceback="Traceback (most recent call last):\nValueError: x")
    assert pop.finish_stage(eid, StageResult(status="failed", failure_kind="runtime", message="ValueError: x",
                                             logs=logs))
    assert pop.evaluation_logs(eid) == logs
    quiet = pop.begin_stage(cand.id, "check")
    assert quiet is not None and pop.finish_stage(quiet, StageResult(status="passed"))
    assert pop.evaluation_logs(quiet) is None
    pop.close()

"""A run stops at the first bench on another kind of card than its population's: speedups of
two kinds of card do not compare (evolve/cards.py). CI has one kind of "card" (the CPU), so the
population's earlier benches are relabelled in the database file as if they had run on an H200
(a fixture for what a test cannot have: a second kind of GPU)."""
from __future__ import annotations

import json
import sqlite3

from evolve.cards import CardGuard
from tests.evolve.search.helpers import population, run_cli, write_config

ELSEWHERE = "NVIDIA H200 (test fixture: benched on another machine)"


def _relabel_benches(db_path, card: str) -> int:
    with sqlite3.connect(db_path) as con:
        cur = con.execute("UPDATE evaluations SET metrics = json_set(metrics, '$.device', ?) "
                          "WHERE stage = 'bench' AND json_extract(metrics, '$.device') IS NOT NULL", (card,))
        return cur.rowcount


def _bench_cards(db_url: str) -> list[str | None]:
    pop = population(db_url)
    return [ev.metrics.get("device") for c in pop.candidates() for ev in pop.evaluations(c.id, "bench")]


def test_a_bench_on_another_card_stops_the_run_and_is_kept(tmp_path, cpu_server):
    db_path = tmp_path / "evolve.db"
    db_url = f"sqlite:///{db_path}"
    cfg = str(write_config(tmp_path, max_evals=1, kind="random", gputest=False))
    first = run_cli("run", cfg, "--remote", cpu_server.url, "--db", db_url, "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    here = {c for c in _bench_cards(db_url) if c}
    assert len(here) == 1 and next(iter(here)).startswith("cpu"), here   # the bench records its card
    assert _relabel_benches(db_path, ELSEWHERE) >= 1

    second = run_cli("run", cfg, "--remote", cpu_server.url, "--db", db_url, "--max-evals", "4", "--json",
                     cwd=tmp_path)
    assert second.returncode == 3, second.stdout + second.stderr[-3000:]
    summary = json.loads(second.stdout)["summary"]
    assert summary["aborted"] is True and "two kinds of card" in summary["stopped_because"], summary
    assert ELSEWHERE in summary["stopped_because"] and "remote.mixed_cards" in summary["stopped_because"]
    cards = _bench_cards(db_url)
    assert any(c and c.startswith("cpu") for c in cards), cards   # the bench that stopped it is recorded
    assert sum(1 for c in cards if c and c.startswith("cpu")) <= 2, cards   # stopped early, not after 4
    runs = population(db_url).runs()
    assert [r.state for r in runs] == ["finished", "failed"], runs

    # told that mixing is meant, the same run goes on to its budget
    third = run_cli("run", cfg, "--remote", cpu_server.url, "--db", db_url, "--max-evals", "1",
                    "--set", "remote.mixed_cards=true", "--json", cwd=tmp_path)
    assert third.returncode == 0, third.stdout + third.stderr[-3000:]
    assert json.loads(third.stdout)["summary"]["aborted"] is False


def test_the_guard_takes_the_first_card_and_refuses_another():
    guard = CardGuard(None)
    assert guard.check({}) is None and guard.check(None) is None   # no card recorded: nothing to compare
    assert guard.check({"device": "NVIDIA H100 80GB HBM3"}) is None and guard.card == "NVIDIA H100 80GB HBM3"
    assert guard.check({"device": "NVIDIA H100 80GB HBM3"}) is None
    why = guard.check({"device": "NVIDIA H200"})
    assert why is not None and "NVIDIA H200" in why and "NVIDIA H100 80GB HBM3" in why
    assert CardGuard("NVIDIA H200", allow_mixed=True).check({"device": "NVIDIA H100 80GB HBM3"}) is None

"""The gputest stage against a candidate's own `regime=NAME bad=X` lines (it shares
test_small.py's stdout): a repeated line cannot hide a bad one, a non-finite fraction counts
as all bad (and never reaches the row as NaN), and the row stores a bounded set of regimes.
The server is faked at `run_python`, so `run_gputest`'s own verdict is what is tested."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

import kcoral.bench.run as bench_run
import kcoral.remote
from kcoral.bench import parse_bad_lines

from evolve.pipeline import gputest
from evolve.population import StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage


def _stage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stdout: str, exit_code: int = 0) -> StageResult:
    def fake_stage(workload_dir, candidate_dir, dest):
        Path(dest).mkdir(parents=True)
        return Path(dest)

    def fake_run_python(client, sends, script, args, env, timeout):
        return SimpleNamespace(stdout=stdout, stderr="", exit_code=exit_code, timed_out=False)

    monkeypatch.setattr(bench_run, "stage_gputest", fake_stage)
    monkeypatch.setattr(kcoral.remote, "run_python", fake_run_python)

    @contextmanager
    def slot(cancel=None):
        yield

    ctx = SimpleNamespace(stages={Stage.GPUTEST: SimpleNamespace(cases="all", timeout=60, quick_calls=0)},
                          gate=SimpleNamespace(slot=slot), cancel=None, client=None,
                          workload_dir=tmp_path, candidate_dir=lambda cand: tmp_path / "cand")
    result = gputest.run(ctx, SimpleNamespace(id=1))  # type: ignore[arg-type]
    json.dumps(result.metrics, allow_nan=False)  # what PostgreSQL's json accepts
    return result


def test_a_later_clean_line_cannot_hide_a_bad_regime(monkeypatch, tmp_path):
    text = "regime=scored bad=0.25\nregime=scored bad=0\nregime=probes bad=0\nregime=probes bad=0\n"
    assert parse_bad_lines(text) == {"scored": 0.25, "probes": 0.0}
    out = _stage(monkeypatch, tmp_path, text)
    assert out.status == EvaluationStatus.FAILED and out.failure_kind == FailureKind.CORRECTNESS
    assert out.metrics["regimes"] == {"scored": 0.25, "probes": 0.0}
    # The order does not matter: the worst of the repeats is kept.
    assert parse_bad_lines("regime=a bad=0\nregime=a bad=0.5\nregime=a bad=0.1\n") == {"a": 0.5}


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_a_non_finite_fraction_counts_as_all_bad(monkeypatch, tmp_path, value):
    text = f"regime=scored bad={value}\nregime=probes bad=0\n"
    assert parse_bad_lines(text) == {"scored": 1.0, "probes": 0.0}
    assert parse_bad_lines(f"regime=scored bad={value}\nregime=scored bad=0\n") == {"scored": 1.0}
    out = _stage(monkeypatch, tmp_path, text)
    assert out.status == EvaluationStatus.FAILED and out.failure_kind == FailureKind.CORRECTNESS
    assert out.metrics["regimes"] == {"scored": 1.0, "probes": 0.0}
    assert "not a finite number, counted as 1.0" in out.message and "scored" in out.message


def test_a_flood_of_regime_lines_is_stored_capped_with_the_bad_ones(monkeypatch, tmp_path):
    lines = [f"regime=r{i} bad=0" for i in range(20_000)] + ["regime=late bad=0.5"]
    out = _stage(monkeypatch, tmp_path, "\n".join(lines) + "\n")
    assert out.status == EvaluationStatus.FAILED and out.failure_kind == FailureKind.CORRECTNESS
    regimes = out.metrics["regimes"]
    assert len(regimes) == gputest.MAX_REGIMES and regimes["late"] == 0.5
    assert out.metrics["regimes_left_out"] == 20_001 - gputest.MAX_REGIMES
    assert len(json.dumps(out.metrics)) < 4000


def test_a_clean_flood_passes_but_stores_a_capped_set(monkeypatch, tmp_path):
    out = _stage(monkeypatch, tmp_path, "".join(f"regime=r{i} bad=0\n" for i in range(5_000)))
    assert out.status == EvaluationStatus.PASSED
    assert len(out.metrics["regimes"]) == gputest.MAX_REGIMES
    assert out.metrics["regimes_left_out"] == 5_000 - gputest.MAX_REGIMES


def test_a_huge_regime_name_is_stored_cut(monkeypatch, tmp_path):
    out = _stage(monkeypatch, tmp_path, f"regime={'x' * 1_000_000} bad=0.5\n")
    assert out.status == EvaluationStatus.FAILED
    assert list(out.metrics["regimes"]) == ["x" * gputest.MAX_REGIME_CHARS]
    assert len(json.dumps(out.metrics)) < 1000


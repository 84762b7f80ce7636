"""test_small.py through `run_gputest` on a real CPU server (the CPU twin's shapes)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kcoral.bench import parse_bad_lines, parse_quick_ms, run_gputest

from .conftest import CPU_WORKLOAD, stage_broken

REGIMES = {"scored", "saturated", "strong", "mixed_depth", "switch", "boundary", "correlated",
           "random_depth", "probes", "holdout_mix", "refresh", "integrity"}


@pytest.mark.slow
def test_reference_is_clean_in_all_twelve_regimes(client):
    g = run_gputest(client, CPU_WORKLOAD, "scratch/reference", env={"T": "160"})
    assert g.passed, g.stdout + g.stderr
    assert set(g.regimes) == REGIMES and all(v == 0 for v in g.regimes.values())
    assert g.stdout.count("bad=0.00e+00") == 12


@pytest.mark.slow
def test_broken_candidate_shows_in_the_right_regimes(client, tmp_path):
    cand = stage_broken("changes_input", tmp_path)
    g = run_gputest(client, CPU_WORKLOAD, cand, cases="integrity,scored", env={"T": "96"})
    assert not g.passed and g.exit_code == 1
    assert set(g.regimes) == {"integrity", "scored"}
    assert g.regimes["integrity"] == 1.0 and g.regimes["scored"] == 1.0
    assert "changed its inputs: q" in g.stderr


def reference_but_when_long(cand: Path, statement: str) -> Path:
    """The reference as a candidate that runs `statement` in setup at lengths over 256 (the
    small cases use 96; the CPU twin's scored length is 512)."""
    cand.mkdir()
    shutil.copyfile(CPU_WORKLOAD / "scratch" / "reference" / "solution.py", cand / "correct.py")
    (cand / "solution.py").write_text(
        "import correct\n\n\ndef setup(data, B, T, H):\n"
        f"    if T > 256:\n        {statement}\n"
        "    return correct.setup(data, B, T, H)\n")
    return cand


def test_parse_bad_lines():
    text = "# device\nregime=scored bad=0.00e+00\nnoise bad=1\nregime=probes bad=1.50e-03\n"
    assert parse_bad_lines(text) == {"scored": 0.0, "probes": 1.5e-3}


@pytest.mark.slow
def test_a_passing_candidate_is_timed_at_the_scored_shape_when_asked(client):
    g = run_gputest(client, CPU_WORKLOAD, "scratch/reference", cases="scored", env={"T": "96"}, quick_calls=2)
    assert g.passed, g.stdout + g.stderr
    assert g.quick_ms is not None and g.quick_ms > 0
    assert "quick_ms=" in g.stdout and "calls=2" in g.stdout


@pytest.mark.slow
def test_a_failing_candidate_is_not_timed(client, tmp_path):
    cand = stage_broken("changes_input", tmp_path)
    g = run_gputest(client, CPU_WORKLOAD, cand, cases="integrity", env={"T": "96"}, quick_calls=2)
    assert not g.passed and g.quick_ms is None
    assert "quick_ms=" not in g.stdout


@pytest.mark.slow
def test_a_candidate_that_breaks_only_at_the_scored_shape_fails(client, tmp_path):
    """Correct at the small shapes, it raises at the workload's own length: the quick time
    reports it as the `scored_shape` regime instead of a time."""
    cand = reference_but_when_long(tmp_path / "short_only", "raise MemoryError('no room for T > 256')")
    g = run_gputest(client, CPU_WORKLOAD, cand, cases="scored", env={"T": "96"}, quick_calls=2)
    assert not g.passed and g.regimes == {"scored": 0.0, "scored_shape": 1.0}, g.stdout + g.stderr
    assert g.quick_ms is None and "no room for T > 256" in g.stderr


def test_bad_quick_calls_are_a_clear_error(client):
    with pytest.raises(ValueError, match="quick_calls"):
        run_gputest(client, CPU_WORKLOAD, "scratch/reference", quick_calls=-1)
    g = run_gputest(client, CPU_WORKLOAD, "scratch/reference", cases="scored", env={"T": "96", "QUICK_CALLS": "many"})
    assert not g.passed and g.exit_code == 2 and "QUICK_CALLS must be a whole number" in g.stderr


def test_parse_quick_ms():
    assert parse_quick_ms("regime=scored bad=0.00e+00\nquick_ms=1.2500 calls=3\n") == 1.25
    assert parse_quick_ms("quick_ms=9 calls=1\nquick_ms=2.5 calls=2\n") == 2.5   # the last line
    for text in ("", "quick_ms=nan calls=2", "quick_ms=-1 calls=2", "quick_ms=inf calls=2", "quick_ms=x calls=2",
                 "noise quick_ms=1 calls=2"):
        assert parse_quick_ms(text) is None, text


@pytest.mark.slow
def test_a_quick_timing_that_runs_out_of_time_costs_only_the_reading(client, tmp_path):
    """Correct at the small shapes, it hangs at the scored one: the regimes stand, and the
    candidate passes without a quick time (it is then never screened)."""
    cand = reference_but_when_long(tmp_path / "hangs_when_long", "__import__('time').sleep(600)")
    g = run_gputest(client, CPU_WORKLOAD, cand, cases="scored", env={"T": "96"}, quick_calls=2, timeout=25)
    assert g.timed_out and g.passed and g.quick_ms is None, g.stdout + g.stderr
    assert g.regimes == {"scored": 0.0} and "ran past the timeout" in g.message

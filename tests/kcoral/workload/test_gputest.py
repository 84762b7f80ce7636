"""test_small.py through `run_gputest` on a real CPU server (the CPU twin's shapes)."""
from __future__ import annotations

import pytest

from kcoral.bench import parse_bad_lines, run_gputest

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


def test_parse_bad_lines():
    text = "# device\nregime=scored bad=0.00e+00\nnoise bad=1\nregime=probes bad=1.50e-03\n"
    assert parse_bad_lines(text) == {"scored": 0.0, "probes": 1.5e-3}

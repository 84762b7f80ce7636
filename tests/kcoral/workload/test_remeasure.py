"""A trial whose host times the judge refuses is measured once more: an honest kernel whose
host misread its clock once gets its own times back, on a real CPU server."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kcoral.bench import run_bench

from .conftest import CPU_WORKLOAD, REFERENCE

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
UNSTEADY, ATTACKS = FIXTURES / "kda_unsteady", FIXTURES / "kda_attacks"


def test_a_trial_refused_once_is_measured_again_and_its_honest_times_stand(client, tmp_path):
    target = tmp_path / "first_timed_host_bent"
    shutil.copytree(UNSTEADY / "first_timed_host_bent", target)
    shutil.copyfile(REFERENCE / "solution.py", target / "correct.py")
    shutil.copyfile(ATTACKS / "patch_clock" / "solution.py", target / "bend.py")
    rep = run_bench(client, CPU_WORKLOAD, target, timeout=240)
    assert rep.passed, rep.message
    first, *rest = rep.trials
    # The host's own times: their median, or their mean where one call ran long (a busy
    # machine: the tests run on two workers); the judge's clock is what it would be without.
    host_clocks = ("host", "host_mean")
    # The trial stands on the host's own times (without a re-measure: the judge's clock) ...
    assert first["kernel"]["clock"] in host_clocks, first
    # ... from the re-measure: the first timed host bent its clock, and that measure, refused,
    # is on record.
    assert first["other_measure"]["kernel"]["clock"] == "judge", first
    assert any(f.startswith("trial 1: re-measured once (kernel refused)") for f in rep.timing_flags), rep.timing_flags
    # The later trials' hosts read their clocks honestly: nothing to measure again.
    assert all("other_measure" not in t for t in rest), rest
    assert all(t["kernel"]["clock"] in host_clocks for t in rest), rest

"""Cheating candidates against the official benchmark on a real CPU server: none may pass
with a figure the honest code does not earn (tests/fixtures/kda_attacks says what each
one tries). The honest reference, benchmarked the same way, runs at about 1x its baseline."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kcoral.bench import run_bench

from .conftest import CPU_WORKLOAD, REFERENCE

pytestmark = pytest.mark.slow

ATTACKS = Path(__file__).resolve().parents[1] / "fixtures" / "kda_attacks"
# The honest reference against the reference baseline: about 1x (0.8 to 1.3 seen on two
# cores). An attack that passes must stay below this.
INFLATED = 2.0


def stage(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(ATTACKS / name, target)
    shutil.copyfile(REFERENCE / "solution.py", target / "correct.py")
    return target


def verdict(rep) -> str:
    return (f"passed={rep.passed} speedup={rep.speedup} kind={rep.failure_kind} "
            f"message={rep.message[:600]!r}")


@pytest.mark.parametrize("name", sorted(p.name for p in ATTACKS.iterdir()
                                        if p.is_dir() and p.name != "sabotage_incumbent"))
def test_attack_earns_no_inflated_figure(client, tmp_path, name):
    rep = run_bench(client, CPU_WORKLOAD, stage(name, tmp_path), timeout=180)
    assert not rep.passed or rep.speedup < INFLATED, verdict(rep)


def test_challenger_cannot_slow_the_incumbent(client, tmp_path):
    rep = run_bench(client, CPU_WORKLOAD, stage("sabotage_incumbent", tmp_path), timeout=180,
                    against=REFERENCE)
    assert not rep.passed or rep.speedup < INFLATED, verdict(rep)

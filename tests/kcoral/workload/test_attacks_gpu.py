"""Cheating candidates against the official benchmark on the scored GPU workload, through a
real GPU server (skipped without CuPy and a GPU; each bench takes about 2.5 minutes on an
H200, most of it fla's first compile). The cheats wrap the two_pass defaults, whose honest
figure is 3.14x fla (docs/benchmarks.md): a cheat that passes must not earn more."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.gpu import gpu_available

from .conftest import GPU_WORKLOAD, REPO

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)

FIXTURES = REPO / "tests" / "fixtures"
HONEST_CEILING = 3.8   # the honest kernel: 3.14x (0.841 ms against fla's 2.640 ms), 3.13x in an evolve run


@pytest.fixture(scope="module")
def gpu_client(salt_file):
    from kcoral.client import Client
    from tests.serverproc import ServerProcess

    with ServerProcess(["--gpus", "0", "--workers-per-gpu", "2", "--holdout-salt-file", str(salt_file)],
                       startup_timeout=120) as srv, Client(srv.url) as c:
        yield c


def stage(attack: Path, dest: Path) -> Path:
    """The attack's solution.py beside the rendered two_pass defaults, as correct.py."""
    from evolve.families import load_family
    from evolve.render import render_candidate

    fam = load_family(REPO / "evolve" / "templates" / "kda" / "two_pass")
    honest = Path(render_candidate(fam, dict(fam.defaults), dest / "render"))
    target = dest / attack.name
    shutil.copytree(honest, target)
    (target / "solution.py").rename(target / "correct.py")
    shutil.copyfile(attack / "solution.py", target / "solution.py")
    return target


@pytest.mark.parametrize("attack", [FIXTURES / "kda_attacks" / "nan_gate",
                                    FIXTURES / "kda_attacks" / "skip_host_work",
                                    FIXTURES / "kda_attacks_gpu" / "patch_events"], ids=lambda p: p.name)
def test_attack_on_the_gpu_earns_no_inflated_figure(gpu_client, tmp_path, attack):
    from kcoral.bench import run_bench

    rep = run_bench(gpu_client, GPU_WORKLOAD, stage(attack, tmp_path), timeout=280)
    verdict = (f"{attack.name}: passed={rep.passed} speedup={rep.speedup} kind={rep.failure_kind} "
               f"flags={rep.timing_flags[:2]} message={rep.message[:600]!r}")
    print(verdict)   # the figures, for docs/benchmarks.md
    assert not rep.passed or rep.speedup < HONEST_CEILING, verdict


def test_an_honest_trial_refused_once_gets_its_own_times_back(gpu_client, tmp_path):
    """The two_pass defaults, with the first timed host's CUDA-event times bent (a tenth):
    that trial is measured again and the re-measure's honest times stand."""
    from kcoral.bench import run_bench

    target = stage(FIXTURES / "kda_unsteady" / "first_timed_host_bent", tmp_path)
    shutil.copyfile(FIXTURES / "kda_attacks_gpu" / "patch_events" / "solution.py", target / "bend.py")
    rep = run_bench(gpu_client, GPU_WORKLOAD, target, timeout=280)
    first = rep.trials[0] if rep.trials else {}
    print(f"passed={rep.passed} kernel_ms={rep.kernel_ms} speedup={rep.speedup} flags={rep.timing_flags}")
    assert rep.passed, rep.message
    assert first["kernel"]["clock"] == "host" and first["other_measure"]["kernel"]["clock"] == "judge", first
    assert rep.speedup < HONEST_CEILING, rep.speedup


def test_a_candidate_with_side_streams_keeps_its_own_times(gpu_client, tmp_path):
    """two_pass with `segments=4` forks two side streams behind the call's stream. Before
    every stream waited on the judge's pre-roll (judge/preroll.py) each call lost a scheduling
    time slice, its host times were refused and it benched at 3.0-3.4 ms against 0.86 ms by
    its events; now the judge's clock agrees with them."""
    from evolve.families import load_family
    from evolve.render import render_candidate
    from kcoral.bench import run_bench

    fam = load_family(REPO / "evolve" / "templates" / "kda" / "two_pass")
    params = dict(fam.defaults, segments=4, stages=3, walk_loads="cp_async")
    rep = run_bench(gpu_client, GPU_WORKLOAD, Path(render_candidate(fam, params, tmp_path)), timeout=280)
    print(f"segments=4: passed={rep.passed} kernel_ms={rep.kernel_ms} speedup={rep.speedup} flags={rep.timing_flags}")
    assert rep.passed, rep.message
    assert all(t["kernel"]["clock"] == "host" for t in rep.trials), rep.trials
    assert rep.kernel_ms < 1.2, rep.kernel_ms

from __future__ import annotations

from datetime import timezone

import pytest

from evolve.config import ConfigError, load_config
from evolve.families import FamilyError
from tests.evolve_search.conftest import REPO


def test_shipped_cpu_config_loads():
    cfg = load_config(REPO / "configs" / "kda-cpu-small.toml")
    assert cfg.workload_dir == REPO / "candidates" / "kda" / "forward_cpu_small"
    assert cfg.gen_dir == cfg.workload_dir / "gen"
    assert cfg.enabled_stages() == ["check", "gputest", "bench"]
    assert list(cfg.load_families()) == ["numpy_chunked"]
    assert cfg.promotion.confirm_runs == 2
    over = cfg.with_budget(max_evals=3, hours=None)
    assert over.budget.max_evals == 3 and over.budget.hours == cfg.budget.hours


def test_shipped_h200_config_loads():
    cfg = load_config(REPO / "configs" / "kda-h200.toml")
    assert cfg.enabled_stages() == ["check", "gputest", "iket", "ncu", "bench"]
    assert [f.name for f in cfg.families] == ["two_pass", "fused"]
    assert cfg.promotion.confirm_runs == 2
    try:
        families = cfg.load_families()
    except FamilyError as exc:   # a family still being written
        pytest.skip(str(exc))
    assert set(families) == {"two_pass", "fused"}


def _write(tmp_path, body: str):
    p = tmp_path / "c.toml"
    p.write_text(f'root = "{REPO}"\nworkload = "candidates/kda/forward_cpu_small"\n'
                 f'[[families]]\nname = "numpy_chunked"\n{body}')
    return p


def test_stage_overrides_merge_with_defaults_and_deadline_is_utc(tmp_path):
    cfg = load_config(_write(tmp_path, '[stages.ncu]\nenabled = true\n[budget]\ndeadline = 2026-12-02T17:00:00\n'))
    assert cfg.stages["ncu"].enabled and cfg.stages["ncu"].app == ["python", "capture_ncu.py"]
    assert cfg.stages["bench"].timeout == 1500
    assert cfg.budget.deadline.tzinfo == timezone.utc


@pytest.mark.parametrize("body, needle", [
    ('[stages.profile]\nenabled = true\n', "unknown stages"),
    ('[strategy]\ntournament_size = 0\n', "tournament_size"),
    ('[promotion]\nconfirm_runs = 0\n', "confirm_runs"),
    ('[budget]\nmax_evals = "many"\n', "max_evals"),
    ('colour = "blue"\n', "colour"),
])
def test_bad_configs_say_why(tmp_path, body, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(_write(tmp_path, body))


def test_missing_workload_and_wrong_family(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('workload = "nowhere"\n[[families]]\nname = "numpy_chunked"\n')
    with pytest.raises(ConfigError, match="workload folder"):
        load_config(p)
    p.write_text(f'root = "{REPO}"\nworkload = "candidates/kda/forward_b1_t8192_h96"\n'
                 '[[families]]\nname = "numpy_chunked"\n')
    with pytest.raises(ConfigError, match="does not render for workload"):
        load_config(p).load_families()

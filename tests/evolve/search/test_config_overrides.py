"""`--set KEY=VALUE`: one setting of a run config changed from the command line."""
from __future__ import annotations

import pytest

from evolve.config import ConfigError, load_config
from evolve.db import open_database
from evolve.population import Population
from evolve.tomlfile import apply_overrides, parse_override
from tests.evolve.search.helpers import run_cli, write_config


@pytest.mark.parametrize("text, path, value", [
    ("stages.ncu.enabled=false", ["stages", "ncu", "enabled"], False),
    ("budget.hours = 0.5", ["budget", "hours"], 0.5),
    ("strategy.kind=evolution", ["strategy", "kind"], "evolution"),        # a bare word is a string
    ('strategy.kind="model"', ["strategy", "kind"], "model"),
    ("stages.iket.app=[\"python\", \"x.py\"]", ["stages", "iket", "app"], ["python", "x.py"]),
    ('families=[{name = "two_pass", fixed = {v_block = 128}}]', ["families"],
     [{"name": "two_pass", "fixed": {"v_block": 128}}]),
    ("output_dir=runs/gen-2", ["output_dir"], "runs/gen-2"),
    ("output_dir=./gen2", ["output_dir"], "./gen2"),
    ("output_dir=/tmp/gen", ["output_dir"], "/tmp/gen"),
])
def test_values_read_as_toml_or_a_bare_word(text, path, value):
    assert parse_override(text) == (path, value)


@pytest.mark.parametrize("text, needle", [
    ("stages.ncu.enabled", "KEY=VALUE"),
    ("=1", "KEY=VALUE"),
    ("stages..enabled=true", "KEY=VALUE"),
    ("strategy.kind=two words", "not TOML"),
    ("budget.hours=[1,", "not TOML"),
])
def test_malformed_overrides_say_why(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_override(text)


def test_overrides_create_tables_index_arrays_and_the_last_one_wins():
    raw = {"families": [{"name": "a"}, {"name": "b"}], "budget": {"hours": 8.0}}
    apply_overrides(raw, ["stages.ncu.enabled=false", "families.1.fixed.chunk=16", "budget.hours=1",
                          "budget.hours=2"])
    assert raw == {"families": [{"name": "a"}, {"name": "b", "fixed": {"chunk": 16}}],
                   "budget": {"hours": 2}, "stages": {"ncu": {"enabled": False}}}


@pytest.mark.parametrize("override, needle", [
    ("families.2.name=x", "has 2 entries"),
    ("families.first.name=x", "has 2 entries"),
    ("budget.hours.max=1", "budget.hours is a value"),
])
def test_overrides_that_cannot_apply_say_where(override, needle):
    raw = {"families": [{"name": "a"}, {"name": "b"}], "budget": {"hours": 8.0}}
    with pytest.raises(ValueError, match=needle):
        apply_overrides(raw, [override])


def test_load_config_applies_overrides_before_validation():
    base = load_config("kda-h200")
    cfg = load_config("kda-h200", ["stages.iket.enabled=false", "stages.ncu.enabled=false",
                                   'families=[{name = "two_pass"}]', "promotion.confirm_runs=3"])
    assert cfg.enabled_stages() == ["check", "gputest", "bench"]
    assert [f.name for f in cfg.families] == ["two_pass"]
    assert cfg.promotion.confirm_runs == 3
    # the rest is the file's, stages merged with their defaults as for a file
    assert cfg.stages["bench"] == base.stages["bench"] and cfg.strategy == base.strategy
    assert cfg.stages["iket"].app == base.stages["iket"].app
    assert load_config("kda-h200") == base   # the built-in file is not changed by an override


def test_an_override_the_model_refuses_names_field_and_override():
    with pytest.raises(ConfigError, match=r"with --set strategy\.kind=annealing: strategy\.kind"):
        load_config("kda-cpu-small", ["strategy.kind=annealing"])
    with pytest.raises(ConfigError, match="colour"):
        load_config("kda-cpu-small", ["colour=blue"])
    with pytest.raises(ConfigError, match=r"--set 'budget\.hours\.x=1': budget\.hours is a value"):
        load_config("kda-cpu-small", ["budget.hours.x=1"])


def test_run_and_evaluate_refuse_bad_overrides_before_any_server(tmp_path):
    db = f"sqlite:///{tmp_path / 'e.db'}"
    proc = run_cli("run", "kda-cpu-small", "--db", db, "--set", "strategy.kind=annealing", cwd=tmp_path)
    assert proc.returncode == 2 and "strategy.kind" in proc.stderr
    assert "embedded server" not in proc.stderr
    proc = run_cli("run", "kda-cpu-small", "--db", db, "--set", "stages.ncu", cwd=tmp_path)
    assert proc.returncode == 2 and "KEY=VALUE" in proc.stderr
    proc = run_cli("evaluate", "1", "--db", db, "--set", "promotion.confirm_runs=1", cwd=tmp_path)
    assert proc.returncode == 2 and "--config" in proc.stderr


def test_a_run_uses_and_records_its_overrides(tmp_path, cpu_server):
    """Budget and stages from --set: one candidate, its check stage only."""
    config = write_config(tmp_path, max_evals=4)
    db = f"sqlite:///{tmp_path / 'evolve.db'}"
    proc = run_cli("run", str(config), "--remote", cpu_server.url, "--db", db,
                   "--set", "budget.max_evals=1", "--set", "stages.gputest.enabled=false",
                   "--set", "stages.bench.enabled=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pop = Population(open_database(db))
    (run,) = pop.runs()
    assert run.config["budget"]["max_evals"] == 1
    assert not run.config["stages"]["gputest"]["enabled"] and not run.config["stages"]["bench"]["enabled"]
    cands = pop.candidates(run.workload_id)
    assert len(cands) == 1
    assert [e.stage for e in pop.evaluations(cands[0].id)] == ["check"]

"""The run configuration (a TOML file): what to search, how, for how long, and where.

Relative paths in a config resolve against `root`, which itself is relative to the
config file's folder. The workload and the families may be named instead: a built-in
workload (kcoral.workloads) or family (evolve.builtin) of that name is used when no folder
of one's own is at that path. Rendered candidates go to `gen/<workload>` in the working
directory, beside the database, unless `output_dir` says otherwise.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kcoral import workloads

from evolve import builtin
from evolve.families import Family, Value, load_family
from evolve.tomlfile import load_toml_model
from evolve.vocabulary import PIPELINE_STAGES, Stage


SET_HELP = ("override one setting of the config, KEY a dotted path and VALUE TOML or a bare word "
            "(repeatable): --set stages.ncu.enabled=false --set 'families=[{name = \"two_pass\"}]'")


class ConfigError(ValueError):
    """A run config that cannot be used, with every reason."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FamilyChoice(_Strict):
    name: str
    path: str | None = None                    # default: the built-in family of that name
    fixed: dict[str, Value] = Field(default_factory=dict)
    subspace: dict[str, list[Value]] = Field(default_factory=dict)


class StrategyConfig(_Strict):
    # "auto" (the model with evolution's proposals mixed in) is the default: on the replay
    # benchmark's six recorded landscapes it reaches within 5 % of the optimum in 0.139 of
    # random search's evaluations (geometric mean), worse than random on none (docs/evolve.md).
    kind: Literal["auto", "model", "evolution", "random", "exhaustive"] = "auto"
    population_size: int = Field(16, ge=1)     # how many of the best correct candidates breed
    tournament_size: int = Field(3, ge=1)
    mutation_rate: float = Field(0.3, ge=0, le=1)   # per extra parameter, after the one that always changes
    crossover_rate: float = Field(0.3, ge=0, le=1)
    immigrant_share: float = Field(0.1, ge=0, le=1)
    islands: int = Field(1, ge=1)
    migration_rate: float = Field(0.1, ge=0, le=1)
    seed: int = 0
    initial_points: int = Field(8, ge=0)       # model: random points before the surrogate decides


class BudgetConfig(_Strict):
    max_evals: int | None = Field(None, ge=1)  # candidates whose pipeline this run starts
    hours: float | None = Field(None, gt=0)
    deadline: datetime | None = None           # absolute, UTC if no zone is given
    # Stop the run after this many consecutive failures of one kind and message (0: never).
    max_same_failures: int = Field(5, ge=0)

    @field_validator("deadline")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return v


class StageConfig(_Strict):
    enabled: bool = True
    timeout: float = Field(600, gt=0)          # seconds, per attempt
    # iket / ncu: the app run in the candidate's folder on the server.
    app: list[str] = Field(default_factory=list)
    ncu_args: list[str] = Field(default_factory=list)
    cases: str = "all"                         # gputest
    # gputest: once correct, time this many calls at the scored shape (0: none). Recorded as
    # the stage's `quick_ms`, a first reading of speed in the candidate's own process: never a
    # result, at most a reason to skip a bench once calibrated against the bench's figures.
    quick_calls: int = Field(0, ge=0)
    # bench: skip it (failure kind "screened") when the candidate's gputest quick_ms is more
    # than this many times the best's official ms (0: never). Set it from measured pairs
    # (benchmarks/quick_vs_bench.py): above the largest quick / bench ratio seen.
    skip_slower_than: float = Field(0.0, ge=0)


def default_stages() -> dict[str, StageConfig]:
    """Every stage's settings when a config names none (fresh objects on each call)."""
    return {
        Stage.CHECK: StageConfig(timeout=300),
        Stage.GPUTEST: StageConfig(timeout=600),
        Stage.IKET: StageConfig(enabled=False, timeout=600, app=["python", "capture_iket.py"]),
        Stage.NCU: StageConfig(enabled=False, timeout=600, app=["python", "capture_ncu.py"],
                           ncu_args=["--set", "full", "--launch-count", "1"]),
        Stage.BENCH: StageConfig(timeout=1500),
    }


class PromotionConfig(_Strict):
    confirm_runs: int = Field(2, ge=1)
    margin: float = Field(0.02, ge=0)          # required speedup over the best beyond the spread (fraction)


class RemoteConfig(_Strict):
    url: str | None = None                     # None: $KCORAL_REMOTE, else an embedded server
    concurrency: int = Field(0, ge=0)          # 0: the server's GPU (or CPU) worker count
    max_queue: int = Field(2, ge=0)            # hold back GPU stages while the server queue is longer
    embedded_cpu_workers: int = Field(2, ge=1)
    transport_wait_s: float = Field(300, gt=0) # how long a stage waits for a restarting server
    mixed_cards: bool = False                  # keep going when a bench runs on another kind of card than the
                                               # population's (its speedups then do not compare: evolve/cards.py)


class RunConfig(_Strict):
    root: str = "."
    workload: str
    output_dir: str | None = None              # rendered candidates; default gen/<workload> in the working directory
    families: list[FamilyChoice] = Field(min_length=1)
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    stages: dict[str, StageConfig] = Field(default_factory=default_stages)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)
    remote: RemoteConfig = Field(default_factory=RemoteConfig)

    # Resolved by load_config (not part of the TOML).
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("stages", mode="before")
    @classmethod
    def _merge_stages(cls, v: object) -> object:
        if not isinstance(v, dict):
            return v
        unknown = set(v) - set(PIPELINE_STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; known: {[str(s) for s in PIPELINE_STAGES]}")
        merged = {name: cfg.model_dump() for name, cfg in default_stages().items()}
        for name, cfg in v.items():
            if isinstance(cfg, dict):
                merged[name].update(cfg)
            else:
                merged[name] = cfg
        return merged

    @model_validator(mode="after")
    def _unique_families(self) -> RunConfig:
        names = [f.name for f in self.families]
        if len(set(names)) != len(names):
            raise ValueError("a family is listed twice")
        return self

    @model_validator(mode="after")
    def _screen_has_its_reading(self) -> RunConfig:
        skip = self.stages[Stage.BENCH].skip_slower_than
        if skip and skip <= 1.0:
            raise ValueError(f"stages.bench.skip_slower_than = {skip:g} would skip candidates faster than the "
                             "best: use 0 (never skip) or a factor above 1")
        gputest = self.stages[Stage.GPUTEST]
        if skip and not (gputest.enabled and gputest.quick_calls > 0):
            raise ValueError("stages.bench.skip_slower_than needs the quick time it compares: an enabled "
                             "[stages.gputest] with quick_calls > 0")
        return self

    # ---- resolved paths ----------------------------------------------------------------
    @property
    def root_dir(self) -> Path:
        return (self.base_dir / self.root).resolve()

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else (self.root_dir / p).resolve()

    @property
    def workload_dir(self) -> Path:
        try:
            return workloads.resolve(self.workload, base=self.root_dir)
        except workloads.WorkloadNotFound as exc:
            raise ConfigError(str(exc)) from None

    @property
    def workload_name(self) -> str:
        return self.workload_dir.name

    @property
    def gen_dir(self) -> Path:
        # Not beside the workload: a built-in one lives in the installed package.
        return self.resolve(self.output_dir) if self.output_dir else (Path.cwd() / "gen" / self.workload_name).resolve()

    def enabled_stages(self) -> list[Stage]:
        return [s for s in PIPELINE_STAGES if self.stages[s].enabled]

    def load_families(self) -> dict[str, Family]:
        """Each configured family, restricted to its fixed values and subspace."""
        out: dict[str, Family] = {}
        for choice in self.families:
            directory = self.resolve(choice.path) if choice.path else builtin.family_dir(choice.name)
            if directory is None:
                raise ConfigError(f"no built-in family {choice.name!r} (built-in: {', '.join(builtin.families())}); "
                                  "give its folder as path")
            family = load_family(directory)
            if family.name != choice.name:
                raise ConfigError(f"family at {directory} is named {family.name!r}, not {choice.name!r}")
            if self.workload_name not in family.spec.workloads:
                raise ConfigError(f"family {family.name!r} does not render for workload "
                                  f"{self.workload_name!r} (it lists {family.spec.workloads})")
            out[family.name] = family.restrict(choice.fixed, choice.subspace)
        return out

    def with_budget(self, max_evals: int | None = None, hours: float | None = None) -> RunConfig:
        """A copy with the command line's budget overrides applied."""
        budget = self.budget.model_copy(update={k: v for k, v in
                                                {"max_evals": max_evals, "hours": hours}.items() if v is not None})
        return self.model_copy(update={"budget": budget})

    def to_record(self) -> dict:
        """The config as stored with the run (JSON-safe)."""
        return self.model_dump(mode="json")


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """A config file, or a built-in config's name (evolve.builtin: kda-cpu-small, kda-h200),
    with `overrides` (`KEY=VALUE`, the command line's `--set`) applied before validation."""
    found = builtin.config_path(path)
    if found is None:
        raise ConfigError(f"config {path} not found (no such file, and the built-in configs are "
                          f"{', '.join(builtin.configs())})")
    cfg = load_toml_model(found, RunConfig, ConfigError, root="config", overrides=overrides)
    cfg.base_dir = found.resolve().parent
    cfg.workload_dir  # noqa: B018 - raises ConfigError for a workload that is neither a folder nor built in
    return cfg

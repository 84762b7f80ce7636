"""The words evolve records: stages, evaluation statuses, run states, failure kinds and
candidate origins, each defined once.

They are `StrEnum`s whose values are the strings the database, the JSON output and the
CLI have always shown, so a member compares equal to (and is stored, printed and dumped
as) its string: rows written before these enums existed read back unchanged.
"""
from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    """Stages in pipeline order: the order the pipeline runs them and tables list them."""

    CHECK = "check"
    GPUTEST = "gputest"
    IKET = "iket"
    NCU = "ncu"
    BENCH = "bench"         # the official benchmark: the stage the leaderboard ranks by
    CONFIRM = "confirm"     # confirmation benches before a promotion
    REBENCH = "rebench"     # more official runs asked for by `evolve evaluate --rebench`


# Stages that may hold several running/passed rows for one candidate (each run is a new
# attempt); every other stage is claimed at most once.
REPEATABLE_STAGES: tuple[Stage, ...] = (Stage.CONFIRM, Stage.REBENCH)
# The configurable pipeline, in order: what a run config's [stages] table names.
PIPELINE_STAGES: tuple[Stage, ...] = tuple(s for s in Stage if s not in REPEATABLE_STAGES)
# Stages that run on this machine, not on a server.
LOCAL_STAGES: frozenset[Stage] = frozenset({Stage.CHECK})
# Stages that need the server's profiling tools.
TOOL_STAGES: tuple[Stage, ...] = (Stage.IKET, Stage.NCU)


class EvaluationStatus(StrEnum):
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"     # its process died or was stopped before a verdict


# The statuses a finished stage attempt records (a verdict on the candidate).
VERDICTS: tuple[EvaluationStatus, ...] = (EvaluationStatus.PASSED, EvaluationStatus.FAILED)
# A claim on (candidate, stage) that stands: another process may not start it again.
LIVE: tuple[EvaluationStatus, ...] = (EvaluationStatus.RUNNING, EvaluationStatus.PASSED)


class RunState(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class Origin(StrEnum):
    TEMPLATE = "template"   # rendered by the search from a family
    AGENT = "agent"         # registered by an agent (`evolve register`)
    SEED = "seed"           # a family's defaults, rendered as the search's first point


class FailureKind(StrEnum):
    CHECK = "check"
    COMPILE = "compile"
    IMPORT = "import"
    CORRECTNESS = "correctness"
    FLAKY = "flaky"
    HOLDOUT = "holdout"
    RUNTIME = "runtime"
    TIMEOUT = "timeout"
    TRANSPORT = "transport"
    RESOURCES = "resources"
    UNAVAILABLE = "unavailable"
    # The bench was not run: the candidate's quick time (gputest) was slower than the best's
    # official figure by more than `[stages.bench] skip_slower_than` (evolve/pipeline/screen.py).
    SCREENED = "screened"


# Failure kinds that say something about the point (not about the server or the network):
# a search model learns to avoid their neighbourhood.
# Not `screened`: that verdict rests on one quick reading against the best of the moment, so
# it keeps the point from being proposed again but teaches nothing about its neighbours.
INFEASIBLE_KINDS: tuple[FailureKind, ...] = (
    FailureKind.CHECK, FailureKind.COMPILE, FailureKind.IMPORT, FailureKind.CORRECTNESS,
    FailureKind.HOLDOUT, FailureKind.RUNTIME, FailureKind.TIMEOUT, FailureKind.RESOURCES,
)

# Failure kinds that say the server or the network failed, not the candidate (its baseline
# broken, a tool missing, the server gone past the transport wait): the stage was never judged,
# so a resumed run runs it again.
SERVER_KINDS: tuple[FailureKind, ...] = (FailureKind.UNAVAILABLE, FailureKind.TRANSPORT)

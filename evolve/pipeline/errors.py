"""Map what a stage raised to a typed failure kind, and tell transport trouble apart.

Transport trouble (connection refused or reset, 502/503, a server restarting) is not the
candidate's fault: the stage waits and retries it. Everything else is recorded.
"""
from __future__ import annotations

import httpx

from kcoral.errors import OutcomeUnknown

from evolve.vocabulary import FailureKind

# Failure kinds of the population contract.
FAILURE_KINDS = frozenset(FailureKind)

_REMOTE_KIND_MAP = {
    "compile": "compile", "runtime": "runtime", "correctness": "correctness", "timeout": "timeout",
    "unavailable": "unavailable", "gpu_access": "resources", "request_too_large": "resources",
    "response_too_large": "resources", "parse": "runtime", "serialization": "runtime", "engine": "runtime",
}


class TransportTrouble(RuntimeError):
    """A stage's remote call came back as a transport failure report (not an exception)."""


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def is_outcome_unknown(exc: BaseException) -> bool:
    """A router lost the node mid-request: not retried in place (see runner.run_stage)."""
    return isinstance(exc, OutcomeUnknown)


def is_transport_error(exc: BaseException) -> bool:
    """True for errors a restarted or overloaded server explains."""
    if is_outcome_unknown(exc):
        return False
    if isinstance(exc, (httpx.TransportError, ConnectionError, TransportTrouble)):
        return True
    if _status(exc) in (502, 503):
        return True
    kind = getattr(exc, "kind", None)
    if kind in ("busy", "transport", "connection"):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and isinstance(cause, (httpx.TransportError, ConnectionError))


def failure_kind(exc: BaseException) -> str:
    """The failure kind to record for an exception that is not transport trouble."""
    if is_outcome_unknown(exc):
        return "transport"
    if isinstance(exc, TimeoutError) or _status(exc) == 504:
        return "timeout"
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str):
        if kind in FAILURE_KINDS:
            return kind
        return _REMOTE_KIND_MAP.get(kind, "runtime")
    return "runtime"


def normalise_kind(kind: str | None, default: str = "runtime") -> str:
    if kind in FAILURE_KINDS:
        return kind  # type: ignore[return-value]
    return _REMOTE_KIND_MAP.get(kind or "", default)

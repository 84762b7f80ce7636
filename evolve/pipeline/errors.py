"""Map what a stage raised to a typed failure kind, and tell transport trouble apart.

Transport trouble (connection refused or reset, 502/503, a server restarting) is not the
candidate's fault: the stage waits and retries it. Everything else is recorded. Only
`kcoral`'s errors are looked at: the client turns whatever its HTTP library raised into
them, so nothing here depends on how the client talks to the server.

Retries live in one layer, the pipeline's (`runner.attempt`), because it owns the
decision: it knows how long a stage may wait for a restarting server (`transport_wait_s`),
whether the run is being cancelled, and that a retry stays in the same evaluation row.
evolve therefore builds its client with `retries=1` (one attempt per call), so the
client's own retry policy, meant for the tools' direct users, is not stacked under it.
"""
from __future__ import annotations

from kcoral.errors import OutcomeUnknown, TransportError
from kcoral.protocol.error_kind import ErrorKind

from evolve.vocabulary import FailureKind

# Failure kinds of the population contract.
FAILURE_KINDS = frozenset(FailureKind)

# A server that is away or overloaded: waited out, never recorded against the candidate.
TRANSIENT_KINDS = frozenset({ErrorKind.BUSY, ErrorKind.TRANSPORT})

_REMOTE_KIND_MAP: dict[str, str] = {
    ErrorKind.COMPILE: "compile", ErrorKind.RUNTIME: "runtime", ErrorKind.CORRECTNESS: "correctness",
    ErrorKind.TIMEOUT: "timeout", ErrorKind.UNAVAILABLE: "unavailable", ErrorKind.GPU_ACCESS: "resources",
    ErrorKind.REQUEST_TOO_LARGE: "resources", ErrorKind.RESPONSE_TOO_LARGE: "resources",
    ErrorKind.PARSE: "runtime", ErrorKind.SERIALIZATION: "runtime", ErrorKind.ENGINE: "runtime",
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
    if isinstance(exc, (TransportError, TransportTrouble)):
        return True
    if _status(exc) in (502, 503):
        return True
    if getattr(exc, "kind", None) in TRANSIENT_KINDS:
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and isinstance(cause, TransportError)


def failure_kind(exc: BaseException) -> str:
    """The failure kind to record for an exception that is not transport trouble."""
    if is_outcome_unknown(exc):
        return "transport"
    if isinstance(exc, TimeoutError) or _status(exc) == 504:
        return "timeout"
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str):
        return normalise_kind(kind)
    return "runtime"


def normalise_kind(kind: str | None, default: str = "runtime") -> str:
    if kind in FAILURE_KINDS:
        return str(kind)
    return _REMOTE_KIND_MAP.get(kind or "", default)

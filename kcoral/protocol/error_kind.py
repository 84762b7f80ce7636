"""`ErrorKind`: every error kind the server, the client, the bench judge and evolve use.

One vocabulary, so a kind one side writes is a kind the other side knows. Values are the
strings on the wire (a `StrEnum` member equals its string), grouped by who says them.
"""
from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    # A FAILED outcome, with the released protocol's meanings (docs/protocol.md).
    PARSE = "parse"                  # module source that does not compile or execute; a missing name
    COMPILE = "compile"              # builtin.compile_cuda
    RUNTIME = "runtime"              # the engine could not carry out an instruction; CUDA faults; a dead worker
    ENGINE = "engine"                # an exception raised by program code
    CORRECTNESS = "correctness"      # builtin.assert_close
    SERIALIZATION = "serialization"  # a value or path that cannot be returned
    UNAVAILABLE = "unavailable"      # a feature this server does not offer
    GPU_ACCESS = "gpu_access"        # a cpu_only function touched the GPU (released; never answered by ours)

    # A non-200 answer (`{"status": "ERROR", "error": {"kind", ...}}`); `parse` (400) and
    # `engine` (500) above double as answers too.
    UNAUTHORIZED = "unauthorized"              # 401
    NOT_FOUND = "not_found"                    # 404
    REQUEST_TOO_LARGE = "request_too_large"    # 413
    CANCELLED = "cancelled"                    # 499: the client went away (client side: Client.abort())
    RESPONSE_TOO_LARGE = "response_too_large"  # 500
    SERVER_TRANSPORT = "server_transport"      # 502 from a router that lost the node mid-request
    BUSY = "busy"                              # 503, with Retry-After
    TIMEOUT = "timeout"                        # 504; client side: no HTTP answer in time

    # Raised by the client itself, never sent by a server.
    TRANSPORT = "transport"              # unreachable server, unreadable answer, digest mismatch
    OUTCOME_UNKNOWN = "outcome_unknown"  # a router lost the node: whether the program ran is unknown
    CACHE_MISS = "cache_miss"            # blobs still missing after all were sent
    UNSUPPORTED = "unsupported"          # the program needs what this server lacks (nothing sent)

    # A bench verdict (the judge's report `failure_kind`, beside `correctness`, `runtime`,
    # `unavailable`, `timeout` and `transport` above).
    CHECK = "check"      # the workload spec (workload.json) is not one the judge accepts
    IMPORT = "import"    # the candidate does not import or set up
    HOLDOUT = "holdout"  # wrong on the holdout inputs
    FLAKY = "flaky"      # results that change from call to call

    @classmethod
    def of(cls, value: str) -> "ErrorKind | str":
        """The member for `value`, or `value` itself: a kind from a newer or foreign server
        is kept as it came rather than refused."""
        try:
            return cls(value)
        except ValueError:
            return value


# The kinds a FAILED outcome carries (the released protocol's); any other kind is an answer
# or the client's own.
FAILED_KINDS: frozenset[ErrorKind] = frozenset({
    ErrorKind.PARSE, ErrorKind.COMPILE, ErrorKind.RUNTIME, ErrorKind.ENGINE, ErrorKind.CORRECTNESS,
    ErrorKind.SERIALIZATION, ErrorKind.UNAVAILABLE, ErrorKind.GPU_ACCESS,
})

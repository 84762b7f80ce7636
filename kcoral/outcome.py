"""`Outcome`: what `Client.execute` returns, with results decoded into Python values."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import RemoteError
from .protocol.error_info import ErrorInfo
from .protocol.error_kind import ErrorKind


class Outcome(BaseModel):
    """A run outcome with results decoded into Python values."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    status: Literal["COMPLETED", "FAILED"]
    request_id: str = ""
    results: dict[str, Any] = Field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: ErrorInfo | None = None
    queue_ms: float = 0.0
    elapsed_ms: float = 0.0
    lease_wait_ms: float = 0.0
    lease_held_ms: float = 0.0
    gpu: int | None = None
    worker_id: str | None = None
    server_instance: str | None = None
    node_id: str | None = None          # the router node that ran it (our server behind a router)

    def raise_for_failure(self) -> "Outcome":
        if self.status == "FAILED":
            err = self.error or ErrorInfo(kind=ErrorKind.ENGINE, message="FAILED without error")
            raise RemoteError(err.kind, err.message, None, self.request_id)
        return self

"""What the server answers: a status, a body and headers, and the protocol's error body."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response

from kcoral.protocol.error_kind import ErrorKind
from kcoral.protocol.strict_json import dumps


@dataclass
class Reply:
    status_code: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def to_response(self) -> Response:
        return Response(self.body, status_code=self.status_code, media_type=self.content_type, headers=self.headers)


def error_reply(code: int, kind: ErrorKind, message: str, request_id: str, retry_after: int | None = None, **extra: Any) -> Reply:
    body = {"status": "ERROR", "request_id": request_id, "error": {"kind": kind, "message": message}, **extra}
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Reply(code, dumps(body), headers=headers)

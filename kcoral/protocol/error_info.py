"""`ErrorInfo`: the `error` object of a FAILED outcome or of a non-200 answer."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainValidator

from .error_kind import ErrorKind


def _kind(value: Any) -> ErrorKind | str:
    if not isinstance(value, str):
        raise ValueError("kind must be a string")
    return ErrorKind.of(value)


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    # A member of ErrorKind, or the string a newer or foreign server sent.
    kind: Annotated[ErrorKind | str, PlainValidator(_kind)]
    message: str = ""
    instruction_index: int | None = None
    instruction_op: str | None = None
    instruction_id: str | None = None
    traceback: str | None = None

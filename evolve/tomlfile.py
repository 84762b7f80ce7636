"""Reading a TOML file into a pydantic model, with errors that name the file and field."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def describe(exc: ValidationError, root: str = "file") -> str:
    """`a.b: message; c: message` for every field pydantic refused."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg']}" for e in exc.errors())


def load_toml_model(path: Path, model: type[M], error: type[Exception], root: str = "file") -> M:
    """Parse `path` and validate it as `model`; any problem raises `error` naming the file."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise error(f"{path}: {describe(exc, root)}") from None

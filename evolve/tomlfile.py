"""Reading a TOML file into a pydantic model, with errors that name the file and field, and
command-line overrides of single settings (`--set stages.ncu.enabled=false`)."""
from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

# A value that is not TOML but reads as one word (or a path) is taken as a string, so that
# `strategy.kind=evolution` or `output_dir=./gen2` needs no shell-quoted TOML string.
_BARE_WORD = re.compile(r"[A-Za-z0-9_./~][A-Za-z0-9_.:/+~-]*")


def describe(exc: ValidationError, root: str = "file") -> str:
    """`a.b: message; c: message` for every field pydantic refused."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg']}" for e in exc.errors())


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=VALUE` as its key path and value. VALUE is TOML (`false`, `1.5`, `"x"`,
    `[1, 2]`, `[{name = "two_pass"}]`), or a bare word taken as a string. ValueError if
    it is neither, or the key is malformed."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    path = key.split(".")
    if not sep or not key or any(not p.strip() for p in path):
        raise ValueError(f"{text!r}: give KEY=VALUE, KEY a dotted path such as stages.ncu.enabled")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        if not _BARE_WORD.fullmatch(value):
            raise ValueError(f"{text!r}: the value is not TOML (quote a string: {key}='\"...\"')") from None
        parsed = value
    return [p.strip() for p in path], parsed


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`raw` with each `KEY=VALUE` set in turn (later ones win). Missing tables on the way
    are created; a number indexes an array the file already has. ValueError names the
    override that cannot be applied; what the value means is left to the model's validation."""
    for text in overrides:
        path, value = parse_override(text)
        node: Any = raw
        for depth, part in enumerate(path[:-1]):
            where = ".".join(path[: depth + 1])
            if isinstance(node, list):
                node = node[_index(text, where, part, node)]
            elif isinstance(node, dict):
                node = node.setdefault(part, {})
            else:
                raise ValueError(f"{text!r}: {'.'.join(path[:depth])} is a value, not a table")
            if not isinstance(node, dict | list):
                raise ValueError(f"{text!r}: {where} is a value, not a table")
        last = path[-1]
        if isinstance(node, list):
            node[_index(text, ".".join(path), last, node)] = value
        else:
            node[last] = value
    return raw


def _index(text: str, where: str, part: str, array: list) -> int:
    if not part.isdigit() or int(part) >= len(array):
        raise ValueError(f"{text!r}: {where}: the array has {len(array)} entries (0 to {len(array) - 1})")
    return int(part)


def load_toml_model(path: Path, model: type[M], error: type[Exception], root: str = "file",
                    overrides: Sequence[str] = ()) -> M:
    """Parse `path`, apply `overrides` (KEY=VALUE) and validate it as `model`; any problem
    raises `error` naming the file (and the override)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: {exc}") from None
    try:
        apply_overrides(raw, overrides)
    except ValueError as exc:
        raise error(f"--set {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        where = f"{path} with --set {' '.join(overrides)}" if overrides else str(path)
        raise error(f"{where}: {describe(exc, root)}") from None

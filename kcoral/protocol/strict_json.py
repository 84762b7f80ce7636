"""The protocol's JSON: duplicate keys, NaN/Infinity and overflowing numbers are errors."""
from __future__ import annotations

import json
import math
from typing import Any

from kcoral.errors import WireError


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise WireError(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise WireError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise WireError(f"number {text} is out of range")
    return value


def loads_strict(data: bytes | str) -> Any:
    """Parse JSON rejecting duplicate keys, NaN/Infinity and overflowing numbers."""
    try:
        return json.loads(
            data,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except WireError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise WireError("JSON nests too deeply") from None


def dumps(obj: Any) -> bytes:
    """Compact JSON that never emits NaN/Infinity."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()

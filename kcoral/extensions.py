"""Opt-ins to our protocol extensions that change what a released client would parse.

A client names the ones it understands in the `KCoral-Extensions` request header
(comma-separated); a stock server ignores the header, so sending it is always safe.
Without it our server answers exactly as the released protocol does.
"""
from __future__ import annotations

from enum import Enum

HEADER = "KCoral-Extensions"


class OptIn(str, Enum):
    EXTRA_DTYPES = "extra_dtypes"  # return uint16/32/64 and complex tensors
    NESTED_REFS = "nested_refs"    # resolve {"$ref"} anywhere inside run args, not only at the top
    CUPY_TENSORS = "cupy_tensors"  # tensor uploads on a GPU worker arrive as CuPy arrays, not torch


def parse_header(value: str | None) -> frozenset[OptIn]:
    """The known opt-ins named in a header value; unknown names are ignored."""
    known = {o.value: o for o in OptIn}
    names = (part.strip() for part in (value or "").split(","))
    return frozenset(known[n] for n in names if n in known)


def header_value(opt_ins: frozenset[OptIn] | set[OptIn]) -> str:
    return ", ".join(sorted(o.value for o in opt_ins))

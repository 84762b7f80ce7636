"""The HTTP body framing: multipart/form-data, encoded and parsed strictly, and the
header parameters it is built from."""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kcoral.errors import WireError

# The part names of /execute: a request's blobs, and a response's returned values.
BLOB_PART_RE = re.compile(r"^blob:([0-9a-f]{64})$")
RETURN_PART_RE = re.compile(r"^return:(0|[1-9][0-9]*)$")


@dataclass(frozen=True)
class Part:
    name: str
    content_type: str
    data: memoryview
    filename: str | None = None


def new_boundary() -> str:
    return "kcoral-" + os.urandom(16).hex()


def encode_multipart(parts: Sequence[tuple[str, str, bytes | memoryview]], boundary: str | None = None,
                     part_lengths: bool = True) -> tuple[str, list[bytes | memoryview]]:
    """Frame parts as multipart/form-data; returns (content-type header, body chunks).

    `part_lengths` adds a Content-Length header to each part (our responses do, so a
    reader can check them); requests leave it out, as common HTTP clients do.
    """
    boundary = boundary or new_boundary()
    chunks: list[bytes | memoryview] = []
    for name, ctype, data in parts:
        length = f"Content-Length: {len(data)}\r\n" if part_lengths else ""
        chunks.append(
            (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n"
             f"Content-Type: {ctype}\r\n{length}\r\n").encode()
        )
        chunks.append(data)
        chunks.append(b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", chunks


def parse_header_params(value: str) -> tuple[str, dict[str, str]]:
    """Split `type; a=b; c="d"` into ("type", {"a": "b", "c": "d"}) honouring quotes."""
    items: list[str] = []
    cur, quoted, esc = [], False, False
    for ch in value:
        if esc:
            cur.append(ch)
            esc = False
        elif ch == "\\" and quoted:
            esc = True
        elif ch == '"':
            quoted = not quoted
            cur.append(ch)
        elif ch == ";" and not quoted:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    main = items[0].strip().lower()
    params: dict[str, str] = {}
    for item in items[1:]:
        if not item.strip():
            continue
        if "=" not in item:
            raise WireError(f"malformed header parameter {item.strip()!r}")
        k, v = item.split("=", 1)
        k, v = k.strip().lower(), v.strip()
        if len(v) >= 2 and v[0] == v[-1] == '"':
            v = v[1:-1]
        if k in params:
            raise WireError(f"duplicate header parameter {k!r}")
        params[k] = v
    return main, params


def parse_multipart(body: bytes, content_type: str) -> list[Part]:
    """Parse a multipart/form-data body strictly; parts keep zero-copy views of `body`."""
    ctype, params = parse_header_params(content_type)
    if ctype != "multipart/form-data":
        raise WireError(f"expected multipart/form-data, got {ctype!r}")
    boundary = params.get("boundary")
    if not boundary or len(boundary) > 200:
        raise WireError("multipart body without a valid boundary")
    delim = b"--" + boundary.encode("latin-1")
    view = memoryview(body)
    if body.startswith(delim):
        pos = len(delim)
    else:
        first = body.find(b"\r\n" + delim)
        if first < 0:
            raise WireError("multipart body has no parts")
        pos = first + 2 + len(delim)
    sep = b"\r\n" + delim
    parts: list[Part] = []
    while True:
        if body[pos:pos + 2] == b"--":
            return parts
        if body[pos:pos + 2] != b"\r\n":
            raise WireError("malformed multipart delimiter")
        pos += 2
        head_end = body.find(b"\r\n\r\n", pos)
        if head_end < 0 or head_end - pos > 16384:
            raise WireError("malformed multipart part headers")
        headers = _part_headers(body[pos:head_end])
        pos = head_end + 4
        end = body.find(sep, pos)
        if end < 0:
            raise WireError("multipart body is truncated")
        disp, dparams = parse_header_params(headers.get("content-disposition", ""))
        if disp != "form-data" or "name" not in dparams:
            raise WireError("multipart part without form-data name")
        if "content-length" in headers:
            try:
                declared = int(headers["content-length"])
            except ValueError:
                raise WireError("malformed part Content-Length") from None
            if declared != end - pos:
                raise WireError(f"part {dparams['name']!r}: Content-Length does not match its data")
        parts.append(Part(
            name=dparams["name"],
            content_type=parse_header_params(headers.get("content-type", "text/plain"))[0],
            data=view[pos:end],
            filename=dparams.get("filename"),
        ))
        pos = end + len(sep)


def _part_headers(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in raw.decode("latin-1").split("\r\n"):
        if ":" not in line:
            raise WireError(f"malformed part header {line!r}")
        k, v = line.split(":", 1)
        k = k.strip().lower()
        if k in out:
            raise WireError(f"duplicate part header {k!r}")
        out[k] = v.strip()
    return out


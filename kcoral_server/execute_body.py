"""The /execute request body rules: one `program` part and `blob:<sha256>` parts, checked
strictly. The framing itself is parsed by `kcoral.protocol.multipart`, the one multipart
parser both sides use (python-multipart serves only as the tests' independent reader)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import cast

from kcoral.errors import WireError
from kcoral.protocol.dtypes import tensor_nbytes
from kcoral.protocol.multipart import BLOB_PART_RE, parse_multipart
from kcoral.protocol.program import ProgramSpec, UploadTensor, parse_program

from .body import RequestTooLarge

# The `program` part's limit. Its JSON becomes Python objects worth up to ~50 times its size
# (a 30 MB program of empty lists took 1.7 GB); data belongs in blob uploads. The programs
# this project builds (a bench, the tool runner) are under 100 KB.
MAX_PROGRAM_BYTES = 4 << 20


@dataclass
class ParsedRequest:
    program: ProgramSpec
    program_hash: str
    blobs: dict[str, memoryview]  # supplied parts, digests verified


def parse_execute_body(body: bytes | memoryview, content_type: str | None, nested_refs: bool = False,
                       max_program_bytes: int = MAX_PROGRAM_BYTES) -> ParsedRequest:
    """Parse and verify an /execute body; raises WireError (HTTP 400 `parse`), or
    RequestTooLarge (413) for a `program` part over `max_program_bytes`.

    A memoryview body (read_body's) is released here, parsed or not: the blobs keep views
    of what they need until they are stored, and the caller's reference, held while the
    request waits for a worker and runs, no longer keeps the whole body in memory."""
    try:
        data = cast(bytes, body.obj) if isinstance(body, memoryview) else body  # a bytearray: it has find()
        return _parse(data, content_type, nested_refs, max_program_bytes)
    finally:
        if isinstance(body, memoryview):
            body.release()


def _parse(body: bytes, content_type: str | None, nested_refs: bool, max_program_bytes: int) -> ParsedRequest:
    if not content_type:
        raise WireError("missing Content-Type (expected multipart/form-data)")
    program_raw, blobs = _split_parts(body, content_type)
    if len(program_raw) > max_program_bytes:
        raise RequestTooLarge(max_program_bytes, f"the 'program' part has {len(program_raw)} bytes, over the "
                              f"{max_program_bytes} allowed: send data as blob uploads, not inline JSON")
    program = parse_program(bytes(program_raw), nested_refs)
    referenced = set(program.blob_digests())
    for digest, data in blobs.items():
        if digest not in referenced:
            raise WireError(f"part blob:{digest} is not referenced by any upload")
        if hashlib.sha256(data).hexdigest() != digest:
            raise WireError(f"part blob:{digest} does not match its digest")
    for i, ins in enumerate(program.instructions):
        if isinstance(ins, UploadTensor) and ins.blob in blobs:
            check_tensor_size(i, ins, len(blobs[ins.blob]))
    # Hash the parsed form, so a retry that re-serialises the same program still matches.
    canonical = json.dumps(program.model_dump(by_alias=True), sort_keys=True, separators=(",", ":"))
    return ParsedRequest(program, hashlib.sha256(canonical.encode()).hexdigest(), blobs)


def _split_parts(body: bytes, content_type: str) -> tuple[memoryview, dict[str, memoryview]]:
    """The `program` part and the blob parts by digest, their names and types checked."""
    program_raw: memoryview | None = None
    blobs: dict[str, memoryview] = {}
    for part in parse_multipart(body, content_type):
        if part.name == "program":
            if program_raw is not None:
                raise WireError("duplicate 'program' part")
            if part.content_type != "application/json":
                raise WireError(f"'program' part must be application/json, not {part.content_type!r}")
            program_raw = part.data
            continue
        m = BLOB_PART_RE.match(part.name)
        if not m:
            raise WireError(f"unexpected part name {part.name!r} (expected 'program' or 'blob:<sha256>')")
        digest = m.group(1)
        if digest in blobs:
            raise WireError(f"duplicate part {part.name!r}")
        if part.content_type != "application/octet-stream":
            raise WireError(f"part {part.name!r} must be application/octet-stream, not {part.content_type!r}")
        blobs[digest] = part.data
    if program_raw is None:
        raise WireError("missing 'program' part")
    return program_raw, blobs


def check_tensor_size(index: int, ins: UploadTensor, size: int) -> None:
    want = tensor_nbytes(ins.dtype, ins.shape)
    if size != want:
        raise WireError(f"instruction {index}: tensor blob has {size} bytes, dtype {ins.dtype} shape {ins.shape} needs {want}")

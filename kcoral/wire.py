"""The KCoral wire format: strict JSON, program models, path rules, multipart framing.

Shared by the client (which builds what it sends) and the server (which validates what it
receives), so both sides agree on one definition of a well-formed program.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# --------------------------------------------------------------------------- limits
DEFAULT_TIMEOUT_SECONDS = 300.0
MAX_TIMEOUT_SECONDS = 3600.0
DEFAULT_OUTPUT_LIMIT = 1 << 20
MAX_OUTPUT_LIMIT = 16 << 20
TRACEBACK_LIMIT = 8 << 10

# Element sizes of the tensor dtypes the protocol carries (names as NumPy/ml_dtypes spell them).
DTYPE_ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "complex64": 8, "complex128": 16,
}

# The dtypes of the released protocol; the rest of DTYPE_ITEMSIZE is our extension, which
# the server returns only to clients that opt in (released clients cannot decode them).
RELEASED_DTYPES: frozenset[str] = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8",
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
})

DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
BUILTIN_RE = re.compile(r"^builtin\.[A-Za-z_][A-Za-z0-9_]*$")
BLOB_PART_RE = re.compile(r"^blob:([0-9a-f]{64})$")
RETURN_PART_RE = re.compile(r"^return:(0|[1-9][0-9]*)$")

class WireError(ValueError):
    """A malformed request or response (maps to HTTP 400 `parse` on the server)."""


# --------------------------------------------------------------------------- strict JSON
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


# --------------------------------------------------------------------------- paths
def normalize_path(path: str, *, allow_root: bool = False) -> str:
    """Apply the protocol's path rules; return the normalised relative path.

    Rules: POSIX separators, relative, no `..`, no backslash or NUL; `.` and repeated
    `/` are dropped. The result names a file unless `allow_root` (a folder return of ".").
    """
    if not isinstance(path, str):
        raise WireError("path must be a string")
    if "\\" in path or "\x00" in path:
        raise WireError(f"path {path!r} contains a backslash or NUL")
    if path.startswith("/"):
        raise WireError(f"path {path!r} is absolute")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise WireError(f"path {path!r} has a '..' component")
    if not parts:
        if allow_root and path.strip("/.") == "" and path != "":
            return ""
        raise WireError(f"path {path!r} names no file")
    if path.endswith("/") and not allow_root:
        raise WireError(f"path {path!r} names a directory, not a file")
    return "/".join(parts)


# --------------------------------------------------------------------------- models
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Ref(_Strict):
    ref: str = Field(alias="$ref", min_length=1)


IdStr = Annotated[str, Field(min_length=1)]
DigestStr = Annotated[str, Field(pattern=DIGEST_RE.pattern)]


class UploadModule(_Strict):
    op: Literal["upload"]
    kind: Literal["module"]
    id: IdStr
    source: str
    language: Literal["python", "cuda"] = "python"


class UploadTensor(_Strict):
    op: Literal["upload"]
    kind: Literal["tensor"]
    id: IdStr
    blob: DigestStr
    dtype: str
    shape: list[int]


class UploadBytes(_Strict):
    op: Literal["upload"]
    kind: Literal["bytes"]
    id: IdStr
    blob: DigestStr


class UploadFile(_Strict):
    op: Literal["upload"]
    kind: Literal["file"]
    blob: DigestStr
    path: str
    id: IdStr | None = None  # released clients from 0.1.1 on name file uploads


class UploadLibrary(_Strict):
    op: Literal["upload"]
    kind: Literal["library"]
    id: IdStr
    blob: DigestStr


class GetFunction(_Strict):
    op: Literal["get_function"]
    id: IdStr
    module: Ref
    name: str = Field(min_length=1)
    cpu_only: bool = False


class Run(_Strict):
    op: Literal["run"]
    id: IdStr
    fn: Union[Ref, str]
    args: list[Any] = Field(default_factory=list)


class ReturnValue(_Strict):
    op: Literal["return"]
    key: str = Field(min_length=1)
    value: Ref


class ReturnPath(_Strict):
    op: Literal["return"]
    key: str = Field(min_length=1)
    kind: Literal["file", "folder"]
    path: Union[Ref, str]


Upload = Union[UploadModule, UploadTensor, UploadBytes, UploadFile, UploadLibrary]
Instruction = Union[Upload, GetFunction, Run, ReturnValue, ReturnPath]

_UPLOAD_KINDS: dict[str, type[_Strict]] = {
    "module": UploadModule, "tensor": UploadTensor, "bytes": UploadBytes,
    "file": UploadFile, "library": UploadLibrary,
}


MAX_GPU_COUNT = 8


class Options(_Strict):
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT
    gpu_count: int | None = None  # released protocol: GPUs leased together for the program

    def clamped(self) -> "Options":
        if self.timeout_seconds <= 0:
            raise WireError("options.timeout_seconds must be positive")
        if self.output_limit_bytes < 0:
            raise WireError("options.output_limit_bytes must not be negative")
        if self.gpu_count is not None and not 1 <= self.gpu_count <= MAX_GPU_COUNT:
            raise WireError(f"options.gpu_count must be an integer from 1 to {MAX_GPU_COUNT}")
        return Options(
            timeout_seconds=min(float(self.timeout_seconds), MAX_TIMEOUT_SECONDS),
            output_limit_bytes=min(int(self.output_limit_bytes), MAX_OUTPUT_LIMIT),
            gpu_count=self.gpu_count,
        )


class ProgramSpec(_Strict):
    """A validated program: instructions in order plus clamped options."""

    instructions: list[Instruction]
    options: Options = Field(default_factory=Options)

    def blob_digests(self) -> list[str]:
        seen: dict[str, None] = {}
        for ins in self.instructions:
            blob = getattr(ins, "blob", None)
            if blob is not None and ins.op == "upload":
                seen.setdefault(blob, None)
        return list(seen)


def _describe(exc: ValidationError) -> str:
    msgs = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msgs.append(f"{loc}: {err['msg']}")
    return "; ".join(msgs)


def _parse_instruction(index: int, raw: Any) -> Instruction:
    if not isinstance(raw, dict):
        raise WireError(f"instruction {index}: must be an object")
    op = raw.get("op")
    model: type[_Strict]
    if op == "upload":
        kind = raw.get("kind")
        if kind not in _UPLOAD_KINDS:
            raise WireError(f"instruction {index}: unknown upload kind {kind!r}")
        model = _UPLOAD_KINDS[kind]
    elif op == "get_function":
        model = GetFunction
    elif op == "run":
        model = Run
    elif op == "return":
        model = ReturnPath if "kind" in raw or "path" in raw else ReturnValue
    else:
        raise WireError(f"instruction {index}: unknown op {op!r}")
    if op == "run" and isinstance(raw.get("fn"), dict):
        raw = {**raw, "fn": Ref.model_validate(_check_ref_shape(index, raw["fn"]))}
    try:
        return model.model_validate(raw)  # type: ignore[return-value]
    except ValidationError as exc:
        raise WireError(f"instruction {index} ({op}): {_describe(exc)}") from None


def _check_ref_shape(index: int, value: Any) -> Any:
    if isinstance(value, dict) and "$ref" in value:
        if len(value) != 1 or not isinstance(value["$ref"], str) or not value["$ref"]:
            raise WireError(f"instruction {index}: a reference must be exactly {{\"$ref\": \"<id>\"}}")
    return value


def iter_refs(index: int, value: Any):
    """Yield every ref id inside a JSON argument tree, checking ref shapes."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            _check_ref_shape(index, v)
            if "$ref" in v:
                yield v["$ref"]
            else:
                stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def parse_program(data: bytes | str | dict, nested_refs: bool = True) -> ProgramSpec:
    """Strictly parse and check a program; raises WireError with a precise message.

    `nested_refs`: references inside run args are checked at any depth (our extension);
    without it only top-level args are references and nested ref-shaped objects are
    literals, as in the released protocol."""
    raw = loads_strict(data) if isinstance(data, (bytes, str)) else data
    if not isinstance(raw, dict):
        raise WireError("program must be a JSON object")
    extra = set(raw) - {"instructions", "options"}
    if extra:
        raise WireError(f"program has unknown fields: {sorted(extra)}")
    if not isinstance(raw.get("instructions"), list):
        raise WireError("program.instructions must be a list")
    instructions = [_parse_instruction(i, ins) for i, ins in enumerate(raw["instructions"])]
    opts_raw = raw.get("options", {})
    if not isinstance(opts_raw, dict):
        raise WireError("program.options must be an object")
    if any(isinstance(v, bool) for v in opts_raw.values()):
        raise WireError("program.options values must be numbers")
    try:
        options = Options.model_validate(
            {k: (float(v) if k == "timeout_seconds" and isinstance(v, int) else v) for k, v in opts_raw.items()}
        )
    except ValidationError as exc:
        raise WireError(f"options: {_describe(exc)}") from None
    _check_semantics(instructions, nested_refs)
    return ProgramSpec(instructions=instructions, options=options.clamped())


def _check_semantics(instructions: list[Instruction], nested_refs: bool = True) -> None:
    kinds: dict[str, str] = {}  # id -> "upload:<kind>" | op
    keys: set[str] = set()
    files: set[str] = set()
    dirs: set[str] = set()

    def need(index: int, ref: str) -> str:
        if ref not in kinds:
            raise WireError(f"instruction {index}: reference {ref!r} names no earlier instruction")
        return kinds[ref]

    for i, ins in enumerate(instructions):
        if isinstance(ins, UploadTensor):
            if ins.dtype not in DTYPE_ITEMSIZE:
                raise WireError(f"instruction {i}: unknown dtype {ins.dtype!r}")
            if any(d < 0 for d in ins.shape):
                raise WireError(f"instruction {i}: negative dimension in shape")
        if isinstance(ins, UploadFile):
            norm = normalize_path(ins.path)
            if norm in files or norm in dirs:
                raise WireError(f"instruction {i}: path {norm!r} conflicts with another upload")
            parents = norm.split("/")[:-1]
            for k in range(1, len(parents) + 1):
                d = "/".join(parents[:k])
                if d in files:
                    raise WireError(f"instruction {i}: {d!r} is both a file and a directory")
                dirs.add(d)
            files.add(norm)
        if isinstance(ins, GetFunction):
            target = need(i, ins.module.ref)
            if target not in ("upload:module", "upload:library"):
                raise WireError(f"instruction {i}: module must reference a module or library upload")
        if isinstance(ins, Run):
            if isinstance(ins.fn, Ref):
                need(i, ins.fn.ref)
            elif not BUILTIN_RE.match(ins.fn):
                raise WireError(f"instruction {i}: fn must be a reference or 'builtin.<name>'")
            if nested_refs:
                for ref in iter_refs(i, ins.args):
                    need(i, ref)
            else:
                for arg in ins.args:
                    if isinstance(arg, dict) and "$ref" in arg:
                        need(i, _check_ref_shape(i, arg)["$ref"])
        if isinstance(ins, ReturnValue):
            need(i, ins.value.ref)
        if isinstance(ins, ReturnPath):
            if isinstance(ins.path, Ref):
                need(i, ins.path.ref)
            else:
                normalize_path(ins.path, allow_root=ins.kind == "folder")
        if isinstance(ins, (ReturnValue, ReturnPath)):
            if ins.key in keys:
                raise WireError(f"instruction {i}: duplicate return key {ins.key!r}")
            keys.add(ins.key)
        ident = getattr(ins, "id", None)
        if ident is not None:
            if ident in kinds:
                raise WireError(f"instruction {i}: duplicate id {ident!r}")
            kinds[ident] = f"upload:{ins.kind}" if ins.op == "upload" else ins.op  # type: ignore[union-attr]


def tensor_nbytes(dtype: str, shape: list[int]) -> int:
    n = DTYPE_ITEMSIZE[dtype]
    for d in shape:
        n *= d
    return n


# --------------------------------------------------------------------------- outcomes
class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: str
    message: str = ""
    instruction_index: int | None = None
    instruction_op: str | None = None
    instruction_id: str | None = None
    traceback: str | None = None


# --------------------------------------------------------------------------- multipart
@dataclass(frozen=True)
class Part:
    name: str
    content_type: str
    data: memoryview
    filename: str | None = None


def new_boundary() -> str:
    return "kcoral-" + os.urandom(16).hex()


def encode_multipart(parts: list[tuple[str, str, bytes | memoryview]], boundary: str | None = None,
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
            from .errors import RemoteError

            err = self.error or ErrorInfo(kind="engine", message="FAILED without error")
            raise RemoteError(err.kind, err.message, None, self.request_id)
        return self

"""Program models and `parse_program`: a program's instructions, checked strictly.

The server parses every program with `parse_program`; `kcoral.Program` builds programs
that pass it.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Iterator, Literal, Union, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kcoral.errors import WireError

from .dtypes import DTYPE_ITEMSIZE
from .limits import DEFAULT_OUTPUT_LIMIT, DEFAULT_TIMEOUT_SECONDS, MAX_GPU_COUNT, MAX_OUTPUT_LIMIT, MAX_TIMEOUT_SECONDS
from .paths import normalize_path
from .strict_json import loads_strict

DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
BUILTIN_RE = re.compile(r"^builtin\.[A-Za-z_][A-Za-z0-9_]*$")


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
_UPLOAD_MODELS = (  # Upload, as isinstance takes it (mypy narrows a tuple, not a Union alias)
    UploadModule, UploadTensor, UploadBytes, UploadFile, UploadLibrary)
Instruction = Union[Upload, GetFunction, Run, ReturnValue, ReturnPath]

_UPLOAD_KINDS: dict[str, type[_Strict]] = {
    "module": UploadModule, "tensor": UploadTensor, "bytes": UploadBytes,
    "file": UploadFile, "library": UploadLibrary,
}



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


def _describe(exc: ValidationError, within: str = "") -> str:
    """The first errors, each at its field's path (under `within`, a field of the input)."""
    msgs = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in ([within] if within else []) + list(err["loc"])) or "(root)"
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
        raw = {**raw, "fn": _fn_ref(index, raw["fn"])}
    try:
        return cast(Instruction, model.model_validate(raw))
    except ValidationError as exc:
        raise WireError(f"instruction {index} ({op}): {_describe(exc)}") from None


def _fn_ref(index: int, fn: dict[str, Any]) -> Ref:
    """A run's `fn` given as an object: a reference (a string names a builtin), checked as
    one, so a malformed one is a parse error that says what is wrong with it."""
    try:
        return Ref.model_validate(_check_ref_shape(index, fn))
    except ValidationError as exc:
        raise WireError(f"instruction {index} (run): {_describe(exc, 'fn')}") from None


def _check_ref_shape(index: int, value: Any) -> Any:
    if isinstance(value, dict) and "$ref" in value:
        if len(value) != 1 or not isinstance(value["$ref"], str) or not value["$ref"]:
            raise WireError(f"instruction {index}: a reference must be exactly {{\"$ref\": \"<id>\"}}")
    return value


def iter_refs(index: int, value: Any) -> Iterator[str]:
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
            kinds[ident] = f"upload:{ins.kind}" if isinstance(ins, _UPLOAD_MODELS) else ins.op

"""`Program`: builds a KCoral program (instructions + blobs) with typed registers."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np

from .values import tensor_payload
from .protocol.dtypes import DTYPE_ITEMSIZE
from .protocol.paths import normalize_path


@dataclass(frozen=True)
class Register:
    """A handle on an earlier instruction's value; passes as `{"$ref": id}`."""

    id: str
    op: str
    kind: str | None = None

    def ref(self) -> dict[str, str]:
        return {"$ref": self.id}


class Program:
    def __init__(self) -> None:
        self.instructions: list[dict[str, Any]] = []
        self.blobs: dict[str, bytes | memoryview] = {}
        self._return_keys: set[str] = set()

    # ------------------------------------------------------------------ helpers
    def _next_id(self, op: str) -> str:
        return f"{op}_{len(self.instructions)}"

    def _blob(self, data: bytes | bytearray | memoryview) -> str:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"blob data must be bytes-like, not {type(data).__name__}")
        data = bytes(data) if isinstance(data, bytearray) else data
        digest = hashlib.sha256(data).hexdigest()
        self.blobs.setdefault(digest, data)
        return digest

    def _arg(self, value: Any) -> Any:
        """Turn a Python argument into its JSON form; bytes and arrays are uploaded."""
        if isinstance(value, Register):
            return value.ref()
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
            return int(value)
        if isinstance(value, (float, np.floating)):
            if not math.isfinite(float(value)):
                raise ValueError(f"argument {value} is not finite; JSON cannot carry it")
            return float(value)
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self.upload(kind="bytes", value=value).ref()
        if isinstance(value, np.ndarray):
            return self.upload(kind="tensor", value=value).ref()
        if isinstance(value, (list, tuple)):
            return [self._arg(v) for v in value]
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(f"argument object keys must be strings, got {k!r}")
                if k == "$ref":
                    raise ValueError("'$ref' is reserved for references; pass a Register")
                out[k] = self._arg(v)
            return out
        raise TypeError(f"cannot pass a {type(value).__name__} as a program argument")

    # ------------------------------------------------------------------ instructions
    @overload
    def upload(self, kind: Literal["module", "tensor", "bytes", "library"], value: Any = None, *,
               source: str | None = None, path: str | None = None, language: str = "python",
               dtype: str | None = None, shape: list[int] | tuple[int, ...] | None = None) -> Register: ...

    @overload
    def upload(self, kind: str, value: Any = None, *, source: str | None = None, path: str | None = None,
               language: str = "python", dtype: str | None = None,
               shape: list[int] | tuple[int, ...] | None = None) -> Register | None: ...

    def upload(
        self,
        kind: str,
        value: Any = None,
        *,
        source: str | None = None,
        path: str | None = None,
        language: str = "python",
        dtype: str | None = None,
        shape: list[int] | tuple[int, ...] | None = None,
    ) -> Register | None:
        """Add an upload. Returns its Register (None for `file`, which has no id)."""
        if kind == "module":
            text = source if source is not None else value
            if not isinstance(text, str):
                raise TypeError("a module upload needs source=<str>")
            if language not in ("python", "cuda"):
                raise ValueError("language must be 'python' or 'cuda'")
            rid = self._next_id("upload")
            ins: dict[str, Any] = {"op": "upload", "kind": "module", "id": rid, "source": text}
            if language != "python":
                ins["language"] = language
            self.instructions.append(ins)
            return Register(rid, "upload", "module")
        if kind == "tensor":
            data: bytes | bytearray | memoryview
            if isinstance(value, np.ndarray):
                dt, shp, data = tensor_payload(value)
            elif isinstance(value, (bytes, bytearray, memoryview)) and dtype and shape is not None:
                dt, shp, data = dtype, list(shape), value
                if dt not in DTYPE_ITEMSIZE:
                    raise ValueError(f"unknown dtype {dt!r}")
            else:
                raise TypeError("a tensor upload needs a numpy array (or bytes with dtype and shape)")
            rid = self._next_id("upload")
            self.instructions.append(
                {"op": "upload", "kind": "tensor", "id": rid, "blob": self._blob(data), "dtype": dt, "shape": shp}
            )
            return Register(rid, "upload", "tensor")
        if kind in ("bytes", "library"):
            rid = self._next_id("upload")
            self.instructions.append({"op": "upload", "kind": kind, "id": rid, "blob": self._blob(value)})
            return Register(rid, "upload", kind)
        if kind == "file":
            if path is None:
                raise TypeError("a file upload needs path=")
            normalize_path(path)
            self.instructions.append({"op": "upload", "kind": "file", "blob": self._blob(value), "path": path})
            return None
        raise ValueError(f"unknown upload kind {kind!r}")

    def get_function(self, module: Register, name: str, cpu_only: bool = False) -> Register:
        if not isinstance(module, Register):
            raise TypeError("module must be a Register from upload(kind='module')")
        rid = self._next_id("get_function")
        ins: dict[str, Any] = {"op": "get_function", "id": rid, "module": module.ref(), "name": name}
        if cpu_only:
            ins["cpu_only"] = True
        self.instructions.append(ins)
        return Register(rid, "get_function")

    def run(self, fn: Register | str, args: list[Any] | tuple[Any, ...] | None = None) -> Register:
        if isinstance(fn, Register):
            fn_json: Any = fn.ref()
        elif fn.startswith("builtin."):
            fn_json = fn
        else:
            raise TypeError("fn must be a Register or 'builtin.<name>'")
        arg_json = [self._arg(a) for a in (args or [])]
        rid = self._next_id("run")
        self.instructions.append({"op": "run", "id": rid, "fn": fn_json, "args": arg_json})
        return Register(rid, "run")

    def return_(self, key: str, value: Register | None = None, *, kind: str | None = None, path: str | Register | None = None) -> None:
        if key in self._return_keys:
            raise ValueError(f"duplicate return key {key!r}")
        if kind is None:
            if not isinstance(value, Register):
                raise TypeError("return_ needs value=<Register> or kind='file'|'folder' with path=")
            ins: dict[str, Any] = {"op": "return", "key": key, "value": value.ref()}
        else:
            if kind not in ("file", "folder"):
                raise ValueError("kind must be 'file' or 'folder'")
            if isinstance(path, Register):
                p: Any = path.ref()
            elif isinstance(path, str):
                normalize_path(path, allow_root=kind == "folder")
                p = path
            else:
                raise TypeError("a file/folder return needs path=")
            ins = {"op": "return", "key": key, "kind": kind, "path": p}
        self._return_keys.add(key)
        self.instructions.append(ins)

    def to_dict(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"instructions": self.instructions}
        if options:
            out["options"] = options
        return out

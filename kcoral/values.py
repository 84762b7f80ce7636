"""The typed value tree: Python values <-> `{"type": ..., ...}` nodes plus binary parts.

Encoding happens where results are produced (the server's worker), decoding where they are
consumed (the client). Binary nodes name parts `return:<i>`, numbered depth-first across
all results in return order.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import SerializationError, WireError
from .protocol.dtypes import DTYPE_ITEMSIZE


@dataclass
class FileValue:
    data: bytes


@dataclass
class FolderValue:
    files: dict[str, bytes] = field(default_factory=dict)
    directories: list[str] = field(default_factory=list)


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype for a protocol dtype name (bfloat16/float8 through ml_dtypes)."""
    if name not in DTYPE_ITEMSIZE:
        raise WireError(f"unknown dtype {name!r}")
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


ALL_DTYPES: frozenset[str] = frozenset(DTYPE_ITEMSIZE)


def tensor_payload(array: np.ndarray, dtypes: frozenset[str] = ALL_DTYPES) -> tuple[str, list[int], memoryview]:
    """(dtype name, shape, little-endian C-order bytes) of an array, copying only if needed."""
    name = str(array.dtype)
    if name not in dtypes:
        raise SerializationError(f"cannot return tensor dtype {name!r}")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    shape = list(array.shape)  # np.ascontiguousarray would turn a 0-d array into shape [1]
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    return name, shape, array.reshape(-1).view(np.uint8).data


class PartSink:
    """Collects binary parts of one response and numbers them in order."""

    def __init__(self, start: int = 0) -> None:
        self.next_index = start
        self.parts: list[tuple[str, memoryview | bytes]] = []

    def add(self, data: bytes | memoryview) -> tuple[str, str]:
        name = f"return:{self.next_index}"
        self.next_index += 1
        self.parts.append((name, data))
        return name, hashlib.sha256(data).hexdigest()


def _host_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    # CuPy (or any device array with a .get() to host) without importing it here.
    if hasattr(value, "__cuda_array_interface__") and hasattr(value, "get"):
        return np.asarray(value.get())
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        return _torch_to_host(value)
    return None


def _torch_to_host(tensor: Any) -> np.ndarray:
    """A torch tensor (any device) as a NumPy array; types NumPy lacks go through ml_dtypes."""
    host = tensor.detach().cpu().contiguous()
    name = str(host.dtype).removeprefix("torch.")
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import torch

        return host.view(torch.uint8).numpy().view(numpy_dtype(name)).reshape(tuple(host.shape))
    return host.numpy()


def encode_value(value: Any, sink: PartSink, _depth: int = 0,
                 dtypes: frozenset[str] = ALL_DTYPES) -> dict[str, Any]:
    """Encode a Python value into a typed node, adding binary payloads to `sink`.

    `dtypes`: the tensor dtypes the receiving client can decode."""
    if _depth > 100:
        raise SerializationError("value nests deeper than 100 levels")
    if value is None:
        return {"type": "null"}
    if isinstance(value, (bool, np.bool_)):
        return {"type": "boolean", "value": bool(value)}
    if isinstance(value, (int, np.integer)):
        return {"type": "integer", "value": int(value)}
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if not math.isfinite(f):
            raise SerializationError(f"number {f} is not finite")
        return {"type": "number", "value": f}
    if isinstance(value, str):
        return {"type": "string", "value": value}
    if isinstance(value, (bytes, bytearray, memoryview)):
        part, digest = sink.add(value if isinstance(value, (bytes, memoryview)) else bytes(value))
        return {"type": "bytes", "part": part, "sha256": digest}
    if isinstance(value, FileValue):
        part, digest = sink.add(value.data)
        return {"type": "file", "size": len(value.data), "part": part, "sha256": digest}
    if isinstance(value, FolderValue):
        files = {}
        for path in sorted(value.files):
            files[path] = encode_value(FileValue(value.files[path]), sink, _depth + 1, dtypes)
        return {"type": "folder", "files": files, "directories": sorted(value.directories)}
    array = _host_array(value)
    if array is not None:
        dtype, shape, data = tensor_payload(array, dtypes)
        part, digest = sink.add(data)
        return {"type": "tensor", "dtype": dtype, "shape": shape, "part": part, "sha256": digest}
    if isinstance(value, (list, tuple)):
        return {"type": "array", "value": [encode_value(v, sink, _depth + 1, dtypes) for v in value]}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SerializationError(f"object key {k!r} is not a string")
            out[k] = encode_value(v, sink, _depth + 1, dtypes)
        return {"type": "object", "value": out}
    raise SerializationError(f"cannot return a value of type {type(value).__module__}.{type(value).__qualname__}")


def _part(node: dict[str, Any], parts: Mapping[str, bytes | memoryview], verify: bool) -> bytes | memoryview:
    name = node.get("part")
    if not isinstance(name, str) or name not in parts:
        raise WireError(f"result references missing part {name!r}")
    data = parts[name]
    if verify and hashlib.sha256(data).hexdigest() != node.get("sha256"):
        raise WireError(f"digest mismatch for part {name}")
    return data


def decode_value(node: Any, parts: Mapping[str, bytes | memoryview], verify: bool = True) -> Any:
    """Decode a typed node back into Python, verifying part digests."""
    if not isinstance(node, dict) or "type" not in node:
        raise WireError(f"malformed value node {node!r:.80}")
    t = node["type"]
    if t == "null":
        return None
    if t in ("boolean", "integer", "number", "string"):
        return node["value"]
    if t == "array":
        return [decode_value(v, parts, verify) for v in node["value"]]
    if t == "object":
        return {k: decode_value(v, parts, verify) for k, v in node["value"].items()}
    if t == "bytes":
        return bytes(_part(node, parts, verify))
    if t == "tensor":
        data = _part(node, parts, verify)
        dtype = numpy_dtype(node["dtype"])
        return np.frombuffer(bytearray(data), dtype=dtype).reshape(node["shape"])
    if t == "file":
        return FileValue(bytes(_part(node, parts, verify)))
    if t == "folder":
        files = {p: bytes(_part(n, parts, verify)) for p, n in node.get("files", {}).items()}
        return FolderValue(files=files, directories=list(node.get("directories", [])))
    raise WireError(f"unknown value type {t!r}")

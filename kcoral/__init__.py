"""KCoral client: build programs, run them on a KCoral server, decode typed results.

Exports resolve lazily, so importing a submodule (the server's workers import
`kcoral.values`) does not pull in the HTTP client.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Client": "client", "KcoralError": "errors", "RemoteError": "errors", "TransportError": "errors",
    "Cancelled": "errors", "WireError": "errors",
    "Program": "program", "Register": "program", "FileValue": "values", "FolderValue": "values",
    "ErrorInfo": "protocol.error_info", "ErrorKind": "protocol.error_kind", "Outcome": "outcome",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'kcoral' has no attribute {name!r}")

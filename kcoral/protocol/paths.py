"""The protocol's path rules, for file uploads and file/folder returns.

The rules themselves live in `kcoral.runners.sandboxed` (standard library only, because
the runners inside a sandbox apply the same rules); here they raise the wire's error.
"""
from __future__ import annotations

from kcoral.errors import WireError
from kcoral.runners import sandboxed


def normalize_path(path: str, *, allow_root: bool = False) -> str:
    """The normalised relative path, or `WireError` (rules: `sandboxed.normalize_path`)."""
    return sandboxed.normalize_path(path, allow_root=allow_root, error=WireError)

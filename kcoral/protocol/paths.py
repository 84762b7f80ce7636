"""The protocol's path rules, for file uploads and file/folder returns."""
from __future__ import annotations

from kcoral.errors import WireError


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

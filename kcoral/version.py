"""Which distribution provides the import package `kcoral`.

Ours (`kcoral-evolve`) and the released `kcoral` both install a package named `kcoral`,
so `kcoral --version` names the distribution as well as its version.
"""
from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "kcoral-evolve"


def version_text() -> str:
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        version = "unknown"
    return f"kcoral ({DISTRIBUTION} {version})"

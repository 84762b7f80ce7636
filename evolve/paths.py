"""How the population stores directories: relative to the working directory when inside it."""
from __future__ import annotations

from pathlib import Path


def display_path(path: Path) -> str:
    """Relative to the working directory when inside it, else absolute (POSIX form)."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()

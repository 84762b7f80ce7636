"""The workloads kcoral ships: each a folder holding `workload.json` (shapes, dtypes,
tolerances, timing), beside the judge its family shares (`kda/judge`), and the reference
candidate in `scratch/reference`. They are package data, so `kcoral bench NAME` and
`evolve run` find them from any directory, in a wheel as in the repository.

A folder of one's own (a path holding `workload.json`) always wins over a built-in name.
"""
from __future__ import annotations

from pathlib import Path

from kcoral.errors import KcoralError

BUILTIN = Path(__file__).resolve().parent
SPEC = "workload.json"


class WorkloadNotFound(KcoralError, LookupError):
    """Neither a workload folder at that path nor a built-in workload of that name."""


def builtin() -> dict[str, Path]:
    """Every built-in workload by name (kda/forward_cpu_small -> forward_cpu_small)."""
    return {spec.parent.name: spec.parent for spec in sorted(BUILTIN.glob(f"*/*/{SPEC}"))}


def resolve(name_or_path: str | Path, base: Path | None = None) -> Path:
    """The workload folder `name_or_path` means: a folder holding workload.json (relative
    paths against `base`, else the working directory), or else a built-in's name."""
    given = Path(name_or_path)
    path = given if given.is_absolute() else (base or Path.cwd()) / given
    if (path / SPEC).is_file():
        return path.resolve()
    found = builtin().get(str(name_or_path)) if len(given.parts) == 1 else None
    if found is not None:
        return found
    known = ", ".join(builtin()) or "none"
    raise WorkloadNotFound(f"{name_or_path}: no {SPEC} at {path}, and no built-in workload of that name "
                           f"(built-in: {known})")

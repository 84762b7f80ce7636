"""What evolve ships as package data: the template families (`templates/<kind>/<family>`,
each with its family.toml) and the run configs (`configs/<name>.toml`). So `evolve run
kda-cpu-small` works from any directory, in a wheel as in the repository. A path of one's
own always wins over a built-in name. (The workloads ship with kcoral: kcoral.workloads.)"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
CONFIGS = HERE / "configs"


def configs() -> dict[str, Path]:
    """Built-in run configs by name (configs/kda-cpu-small.toml -> kda-cpu-small)."""
    return {p.stem: p for p in sorted(CONFIGS.glob("*.toml"))}


def families() -> dict[str, Path]:
    """Built-in template families by name (templates/kda/two_pass -> two_pass)."""
    return {p.parent.name: p.parent for p in sorted(TEMPLATES.glob("*/*/family.toml"))}


def config_path(name_or_path: str | Path) -> Path | None:
    """The config file meant: an existing file, else a built-in config's name (None: neither)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    return configs().get(str(name_or_path)) if len(path.parts) == 1 else None


def family_dir(name: str) -> Path | None:
    return families().get(name)


def family_path(name_or_path: str | Path) -> Path | None:
    """The family meant: a folder holding a family.toml, else a built-in family's name (None: neither)."""
    path = Path(name_or_path)
    if (path / "family.toml").is_file():
        return path
    return family_dir(str(name_or_path)) if len(path.parts) == 1 else None

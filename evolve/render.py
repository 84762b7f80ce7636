"""Render a family's templates at one parameter point into a content-addressed folder.

The folder name is the SHA-256 of the rendered sources, so two points that render the same
code share one candidate and are rendered (and evaluated) once. Rendering goes to a
temporary folder beside the destination and is renamed into place, so a crash never
leaves a half-written candidate under its final name.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from evolve.digest import PARAMS_FILE, source_digest
from evolve.families import Family

__all__ = ["PARAMS_FILE", "RenderError", "params_record", "render_candidate", "render_sources", "source_digest"]


class RenderError(RuntimeError):
    """A template that failed to render (undefined name, syntax error), with where."""


@functools.lru_cache(maxsize=64)
def _environment(directory: Path, include_dirs: tuple[str, ...] = ()) -> jinja2.Environment:
    # One environment per family folder: Jinja caches compiled templates inside it. Its own
    # folder first, then the folders its includes may also come from.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(directory), *(str((directory / d).resolve()) for d in include_dirs)]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_sources(family: Family, params: Mapping[str, Any], suffix: str = "") -> dict[str, bytes]:
    """The files of a candidate (name -> bytes), without params.json; with `suffix`, only
    the rendered files whose names end with it (the copied ones are never rendered)."""
    point = family.validate(params)
    variables: dict[str, Any] = {**family.environment(point), "params": dict(point), "family_name": family.name}
    env = _environment(family.directory, tuple(family.spec.include_dirs))
    files: dict[str, bytes] = {}
    for rel in family.spec.render:
        if not rel.removesuffix(".j2").endswith(suffix):
            continue
        try:
            text = env.get_template(rel).render(**variables)
        except jinja2.TemplateError as exc:
            lineno = getattr(exc, "lineno", None)  # only a TemplateSyntaxError knows its line
            where = f"{rel}:{lineno}" if lineno else rel
            raise RenderError(f"family {family.name!r}: {where}: {exc}") from None
        files[Path(rel).name[: -len(".j2")]] = text.encode("utf-8")
    for rel in family.spec.copy_files if not suffix else ():
        files[Path(rel).name] = (family.directory / rel).read_bytes()
    return files


def params_record(family: str, params: dict[str, Any]) -> str:
    """params.json: which family and point a rendered folder holds (not digested)."""
    return json.dumps({"family": family, "params": params}, indent=2, sort_keys=True) + "\n"


def render_candidate(family: Family, params: Mapping[str, Any], dest_root: str | Path) -> Path:
    """Render `params` of `family` into `dest_root/<digest>/` and return that folder."""
    dest_root = Path(dest_root)
    files = render_sources(family, params)
    point = family.validate(params)
    dest_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".render-", dir=dest_root))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        digest = source_digest(tmp)
        final = dest_root / digest
        if final.is_dir():
            return final
        (tmp / PARAMS_FILE).write_text(params_record(family.name, point), encoding="utf-8")
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process renamed the same sources into place first: use theirs.
            if not final.is_dir():
                raise
        return final
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

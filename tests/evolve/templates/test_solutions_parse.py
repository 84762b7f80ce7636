"""Every admitted point of every family renders a `solution.py` that Python can compile:
the GPU-only families cannot be imported without CuPy, so this is where a template slip in
their Python (an indentation error in a changed block, say) shows up without a GPU."""
from __future__ import annotations

import pytest

from .conftest import TEMPLATES

FAMILIES = sorted(p.parent.name for p in TEMPLATES.glob("*/family.toml"))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_point_renders_python_that_compiles(family):
    from evolve.families import load_family
    from evolve.render import render_sources

    fam = load_family(TEMPLATES / family)
    points = list(fam.points())
    assert points, f"{family} admits no point"
    compiled: set[bytes] = set()   # points that render the same Python, compiled once
    for params in points:
        files = render_sources(fam, params, suffix=".py")   # the CUDA sources: the compile tests
        assert files, f"{family} renders no Python"
        for name, body in files.items():
            if body not in compiled:
                compile(body.decode(), f"{family}:{params}:{name}", "exec")
                compiled.add(body)

"""Every admitted point of every family renders a `solution.py` that Python can compile:
the GPU-only families cannot be imported without CuPy, so this is where a template slip in
their Python (an indentation error in a changed block, say) shows up without a GPU."""
from __future__ import annotations

import jinja2
import pytest
from jinja2 import meta

from .conftest import TEMPLATES

FAMILIES = sorted(p.parent.name for p in TEMPLATES.glob("*/family.toml"))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_point_renders_python_that_compiles(family):
    from evolve.families import load_family
    from evolve.render import render_sources

    fam = load_family(TEMPLATES / family)
    # Points that agree on every name the Python templates read render the same Python: one
    # of each is rendered (two_pass's 147,576 points took 52 s, one render each).
    sources = [(TEMPLATES / family / rel).read_text() for rel in fam.spec.render if rel.endswith(".py.j2")]
    assert sources, f"{family} renders no Python"
    reads = sorted(set().union(*(meta.find_undeclared_variables(jinja2.Environment().parse(s)) for s in sources)))
    assert "params" not in reads, "a template reading the whole point defeats the grouping"
    # ... and agree on them wherever they agree on the parameters behind them, which is cheaper
    # to tell than deriving every point's values
    behind = sorted(fam.parameters_behind(reads))
    seen: set[tuple] = set()
    compiled: set[bytes] = set()   # points that render the same Python, compiled once
    admitted = 0
    for params in fam.points():   # a generator: fused_tiles admits about a million
        admitted += 1
        key = tuple(repr(params[n]) for n in behind)
        if key in seen:
            continue
        seen.add(key)
        files = render_sources(fam, params, suffix=".py")   # the CUDA sources: the compile tests
        for name, body in files.items():
            if body not in compiled:
                compile(body.decode(), f"{family}:{params}:{name}", "exec")
                compiled.add(body)
    assert admitted, f"{family} admits no point"

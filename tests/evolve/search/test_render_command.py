"""`evolve render`, through the real command line: a point of a built-in family rendered as
the search would render it, and every way of asking for a point the family does not admit
refused with the reason, writing nothing."""
from __future__ import annotations

import json

from evolve.builtin import family_dir
from evolve.families import load_family
from evolve.render import PARAMS_FILE, render_candidate, source_digest

from .helpers import run_cli


def test_renders_the_defaults_with_the_values_given(tmp_path):
    res = run_cli("render", "two_pass", "walk_loads=cp_async", "stages=3", "--out", str(tmp_path / "pts"), "--json",
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    fam = load_family(family_dir("two_pass"))
    want = {**fam.defaults, "walk_loads": "cp_async", "stages": 3}   # 3 the number, as the family lists it
    assert doc["params"] == want and doc["given"] == {"walk_loads": "cp_async", "stages": 3}
    folder = tmp_path / "pts" / doc["digest"]
    assert doc["folder"] == str(folder) and folder.name == source_digest(folder)
    assert json.loads((folder / PARAMS_FILE).read_text()) == {"family": "two_pass", "params": want}
    # the very folder a search would make of that point
    assert render_candidate(fam, want, tmp_path / "search").name == doc["digest"]


def test_plain_output_is_the_folder_under_gen_render(tmp_path):
    res = run_cli("render", "numpy_chunked", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    folder = tmp_path / res.stdout.strip()
    assert folder.parent == tmp_path / "gen" / "render" and (folder / "solution.py").is_file()


def test_points_the_family_does_not_admit_are_refused_with_the_reason(tmp_path):
    out = tmp_path / "pts"
    for args, why in ((["stages=7"], "stages=7 is not one of 1, 2, 3"),
                      (["foo=1"], "has no parameter 'foo'"),
                      (["stages"], "NAME=VALUE"),
                      (["stages=2", "stages=3"], "stages given more than once"),
                      (["state_step=warp_local"], "walk_loads = 'bulk' needs the wgmma walk")):
        res = run_cli("render", "two_pass", *args, "--out", str(out), cwd=tmp_path)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert why in res.stderr, (args, res.stderr)
    res = run_cli("render", "no_such_family", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2 and "built-in family" in res.stderr
    assert not out.exists()

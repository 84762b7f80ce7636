from __future__ import annotations

import json
import threading

import pytest

from evolve.families import ParamsError, load_family
from evolve.render import PARAMS_FILE, RenderError, render_candidate, source_digest


def test_render_writes_sources_params_and_digest_named_folder(toy_family, tmp_path):
    fam = load_family(toy_family)
    out = render_candidate(fam, fam.defaults, tmp_path / "gen")
    assert out.parent == tmp_path / "gen"
    assert sorted(p.name for p in out.iterdir()) == ["helper.cuh", "kernel.cu", PARAMS_FILE, "solution.py"]
    assert out.name == source_digest(out)
    assert "BLOCK = 64" in (out / "solution.py").read_text()
    assert "SMEM = 512" in (out / "solution.py").read_text()       # derived values reach templates
    assert (out / "helper.cuh").read_text() == "#define HELPER 1\n"
    assert json.loads((out / PARAMS_FILE).read_text()) == {"family": "toy", "params": fam.defaults}
    # nothing temporary left behind
    assert [p.name for p in (tmp_path / "gen").iterdir()] == [out.name]


def test_identical_sources_share_one_folder_rendered_once(toy_family, tmp_path):
    fam = load_family(toy_family)
    a = render_candidate(fam, fam.defaults, tmp_path)
    stamp = (a / PARAMS_FILE).stat().st_mtime_ns
    # `unused` is not used by any template: same sources, same folder, not rewritten
    b = render_candidate(fam, dict(fam.defaults, unused=1), tmp_path)
    assert a == b and (a / PARAMS_FILE).stat().st_mtime_ns == stamp
    c = render_candidate(fam, dict(fam.defaults, block=32), tmp_path)
    assert c != a and c.name == source_digest(c)


def test_concurrent_renders_of_one_point_agree(toy_family, tmp_path):
    fam = load_family(toy_family)
    results: list = []
    gen = tmp_path / "gen"
    threads = [threading.Thread(target=lambda: results.append(render_candidate(fam, fam.defaults, gen)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    assert [p.name for p in gen.iterdir()] == [results[0].name]


def test_render_refuses_points_outside_the_space(toy_family, tmp_path):
    fam = load_family(toy_family)
    with pytest.raises(ParamsError, match="too much shared memory"):
        render_candidate(fam, dict(fam.defaults, block=128, tile=4), tmp_path / "gen")
    assert not (tmp_path / "gen").exists()


def test_undefined_template_variable_is_an_error(toy_family, tmp_path):
    (toy_family / "solution.py.j2").write_text("X = {{ no_such_name }}\n")
    fam = load_family(toy_family)
    with pytest.raises(RenderError, match="no_such_name"):
        render_candidate(fam, fam.defaults, tmp_path / "gen")
    assert not (tmp_path / "gen").exists() or not any((tmp_path / "gen").iterdir())

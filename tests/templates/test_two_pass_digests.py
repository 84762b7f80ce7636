"""The two_pass points that existed before `state_step` and `prep_smem` were added render
byte for byte as they did (digests recorded before the change), so their measurements
and database rows stay valid; the new parameters only add points."""
from __future__ import annotations

import hashlib

import pytest

from .conftest import TEMPLATES

# sha256 over the rendered files (name and bytes, sorted by name), recorded before the change
BEFORE = {
    (1, 4, 32): "ac7ad925d1b28cdd644e1a1d64f76e611c1c46ff0c917ed24897b598ec9d735d",
    (1, 4, 64): "9186b09f00eca1f6504895bb04ef97a85c75340a727ff3e73bb938a5415ab3de",
    (1, 8, 32): "96c37dc1d1b043694d6fffe97a3695ba5384d024d6c13465fc3a31ee9380da48",
    (1, 8, 64): "1de714938215549f33b14c84db73de7f7d2f7ba8ee2b2ee7eef0bb113ebbce58",
    (1, 8, 128): "40ea41ebc6981ac616c782aa06e418005db9a27d154ccd2dcb1e4faa4f8182cc",
    (2, 4, 32): "0997266fb2cbbd46f122885ac4067329962e313750c08f12a317991b206cf6ff",
    (2, 4, 64): "217c8f90b354c32ba9aca4b5f2792005665c98fe657b1980c96809530c51b0be",
    (2, 8, 32): "4cd1a4799954c2bd0ed8fde49855b8199ce30bd31e0c7ccae875638b29e885e8",
    (2, 8, 64): "8b0e93b5f8c3928c26308ac94bb5fd182cd441bd3ab7d255294a158ed6d68672",
    (2, 8, 128): "87665738feaaa7a277c12a1e2fb8d720e7a99891fe1510d0623b799e8e77ec6a",
}


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{len(name)}:{name}:{len(files[name])}:".encode())
        h.update(files[name])
    return h.hexdigest()


@pytest.mark.parametrize("stages, state_warps, v_block", sorted(BEFORE))
def test_existing_points_render_unchanged(stages, state_warps, v_block):
    from evolve.families import load_family
    from evolve.render import render_sources

    fam = load_family(TEMPLATES / "two_pass")
    params = {**fam.defaults, "stages": stages, "state_warps": state_warps, "v_block": v_block}
    assert params["state_step"] == "cta" and params["prep_smem"] == "full"
    assert fam.check(params) == []
    assert _digest(render_sources(fam, params)) == BEFORE[(stages, state_warps, v_block)]


def test_defaults_unchanged():
    from evolve.families import load_family

    fam = load_family(TEMPLATES / "two_pass")
    assert {k: fam.defaults[k] for k in ("chunk", "v_block", "state_warps", "stages")} == \
        {"chunk": 64, "v_block": 128, "state_warps": 8, "stages": 1}
    assert fam.defaults["state_step"] == "cta" and fam.defaults["prep_smem"] == "full"

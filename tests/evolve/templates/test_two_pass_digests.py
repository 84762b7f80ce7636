"""The two_pass points that existed before `state_step` and `prep_smem` were added render
the same CUDA sources as they did (digests recorded before the change), so their kernel
timings stay valid; the new parameters only add points. The digests cover the `.cu` and
`.cuh` files alone: `solution.py` changed since, to keep the scratch alive after setup.

The full and lean prep kernels are also pinned as the compiler reads them (comments and
whitespace normalised, every admitted point): the guarantee that merging their templates
into one changed neither kernel, whatever the comments and layout of the template."""
from __future__ import annotations

import hashlib
import re

import pytest

from .conftest import NOT_TILES, TEMPLATES

# sha256 over the rendered CUDA files (name and bytes, sorted by name), recorded before the change
BEFORE = {
    (1, 4, 32): "74f9127d03df08ad50aa06eb9090b79774091b82b2dd36e867b1434edad826a1",
    (1, 4, 64): "bc57a31e5e7c7bfec0e14f1e5728a8153c1e8b97bdae0209cbab8aa44cb16276",
    (1, 8, 32): "81be4ae56612f218a87db63c2d06fb0f3b163071464fe123e0e1955c0494a31c",
    (1, 8, 64): "0d45fc26bcb219fafe6abf3071339aa16234fb3cd37ac1729d80b5db399cbce0",
    (1, 8, 128): "58a492f2810e84198a490f11c08f7fa4686cc8a5de6f764febaac8c4650df1ab",
    (2, 4, 32): "92b0ea57884ea5c89768197b47afa8f2900e3968f5853517d259923ad1f7d28d",
    (2, 4, 64): "a24ef6daabfb5ce0a7c9d5adb21857eb8533eb953a3104043c66cff779ddf3ca",
    (2, 8, 32): "881eb3dbd7489863aa2b35ec39a9b80638b3554a9e3cad475297c0bd9802a339",
    (2, 8, 64): "29f8b97c065b024cffbd4f41579bf4ec734f46f74086c3527f100689147b10a8",
    (2, 8, 128): "9d5d2bf9fe482e2e57b22ca4a94eaeb150073721382564785f08353ddfb449e4",
}


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{len(name)}:{name}:{len(files[name])}:".encode())
        h.update(files[name])
    return h.hexdigest()


def _compiled_cuda(files: dict[str, bytes]) -> dict[str, bytes]:
    """The .cu files and the headers they include: what the point compiles (a header the
    family ships for other points, such as the wgmma one, does not change it)."""
    include = re.compile(rb'#include "([^"]+)"')
    keep = {n for n in files if n.endswith(".cu")}
    while True:   # headers, and the headers they include
        more = {m.decode() for n in keep for m in include.findall(files[n])} & set(files)
        if more <= keep:
            return {n: files[n] for n in keep}
        keep |= more


@pytest.mark.parametrize("stages, state_warps, v_block", sorted(BEFORE))
def test_existing_points_render_unchanged(stages, state_warps, v_block):
    from evolve.families import load_family
    from evolve.render import render_sources

    fam = load_family(TEMPLATES / "two_pass")
    params = {**fam.defaults, "stages": stages, "state_warps": state_warps, "v_block": v_block,
              "state_step": "cta", "prep_smem": "full", **NOT_TILES}
    assert fam.check(params) == []
    assert _digest(_compiled_cuda(render_sources(fam, params))) == BEFORE[(stages, state_warps, v_block)]


def test_defaults_unchanged():
    from evolve.families import load_family

    fam = load_family(TEMPLATES / "two_pass")
    # the fastest point measured (docs/benchmarks.md, the walk's bulk loads on two ring slots); change with a new measurement
    assert fam.defaults == {"chunk": 64, "v_block": 128, "state_warps": 8, "stages": 2,
                            "state_step": "wgmma", "prep_smem": "tiles", "uo_blocks": 2,
                            "out_store": "inline", "prep_schedule": "grid", "segments": 1,
                            "diag_inverse": "in_blocks", "inverse_products": "tf32", "flush_denormals": 1,
                            "prep_order": "by_chunk_descending", "elementwise": "fp32", "ut_product": "prep",
                            "row_norms": "tensor_cores", "walk_loads": "bulk", "w_gamma": "tile", "t_bf16": "converted"}


# ---- the full and lean prep kernels, as the compiler sees them --------------------------
# sha256 of each distinct normalised kda_prep.cu over every admitted point with
# prep_smem "full" or "lean", keyed by the parameters that change it (no other parameter
# does: the prep kernel does not see the state kernel's). Recorded before the two
# templates were merged into one.
PREP_BEFORE = {
    ("full", 64): "13eb8987130843df0dd73e6874ee052bbb30d3373aeda72706c1ca57630278fb",
    ("lean", 64): "f822bff08c743e85391d0c91875aae57f8598694aad426e4980507a7b97581a9",
}


def _normalised(cuda: str) -> str:
    """The source without comments, every whitespace run one space: what the compiler
    reads, so a comment or a line break moved while editing the template does not count."""
    cuda = re.sub(r"//[^\n]*|/\*.*?\*/", " ", cuda, flags=re.S)
    return re.sub(r"\s+", " ", cuda).strip()


def test_full_and_lean_prep_kernels_unchanged():
    from evolve.families import load_family
    from evolve.render import render_sources

    fam = load_family(TEMPLATES / "two_pass")
    seen: dict[tuple[object, ...], set[str]] = {}
    for point in fam.points():
        if point["prep_smem"] not in ("full", "lean"):
            continue
        cuda = render_sources(fam, point)["kda_prep.cu"].decode()
        key = (point["prep_smem"], point["chunk"])
        seen.setdefault(key, set()).add(hashlib.sha256(_normalised(cuda).encode()).hexdigest())
    assert {key: sorted(d) for key, d in seen.items()} == {key: [d] for key, d in PREP_BEFORE.items()}


# ---- the tiles prep and the wgmma walk, since the fused_tiles family includes them -------
# sha256 over the compiled CUDA files, recorded before the two templates took the hooks that
# let fused_tiles include them (a ring slot as the prep's output, the chunk step in a file of
# its own, the two kernels left out): two_pass's points must render as they did.
INCLUDED_BEFORE = {
    "defaults": ({}, "6a6945cfc7af576d1870b145ab1c34c723fcc75c025fc28aba9c725bd70314f1"),
    "cp_async_s3": ({"walk_loads": "cp_async", "stages": 3},
                    "b8ba824bd6f2b56d3bde3ee03db976a3d0a78f43c9144e70fe27a5a2b6b7f78f"),
    "ut_state_bulk": ({"ut_product": "state", "stages": 2},
                      "edf2c8b883665da658b6424d9cd611dbe221e115498ce2209c1c512f2c6ab635"),
    "deferred_fragments_direct_once": ({"out_store": "deferred", "w_gamma": "fragments", "t_bf16": "direct",
                                        "row_norms": "tensor_cores_once"},
                                       "1174c63e5c5f9bdc24a4cf3c31a14de2357655cc32a6251758b20a6882d6fefb"),
    "persistent": ({"prep_schedule": "persistent", "prep_order": "by_head"},
                   "2e6e27c42a67373943278c7b84dac24dfc546da8eca7f8d72dc7a80427caf558"),
}


@pytest.mark.parametrize("name", sorted(INCLUDED_BEFORE))
def test_points_of_the_included_templates_render_unchanged(name):
    from evolve.families import load_family
    from evolve.render import render_sources

    fam = load_family(TEMPLATES / "two_pass")
    overrides, digest = INCLUDED_BEFORE[name]
    params = {**fam.defaults, **overrides}
    assert fam.check(params) == []
    assert _digest(_compiled_cuda(render_sources(fam, params))) == digest

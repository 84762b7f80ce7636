"""The two_pass points that existed before `state_step` and `prep_smem` were added render
the same CUDA sources as they did (digests recorded before the change), so their kernel
timings stay valid; the new parameters only add points. The digests cover the `.cu` and
`.cuh` files alone: `solution.py` changed since, to keep the scratch alive after setup.

The full and lean prep kernels are also pinned as the compiler reads them (comments and
whitespace normalised, every admitted point): the guarantee that merging their templates
into one changed neither kernel, whatever the comments and layout of the template.

iket.cuh counts as an untraced build reads it (its `#ifdef IKET` branch left out): the
digests below were re-recorded that way at 78b9182, where the raw-byte digests recorded
before still held, so the sources they pin are those same sources."""
from __future__ import annotations

import hashlib
import re

import pytest

from .conftest import NOT_TILES, TEMPLATES

# sha256 over the rendered CUDA files (name and bytes, sorted by name), recorded before the change
BEFORE = {
    (1, 4, 32): "fbdcf30eb2149b8746d35e3d37074ed8838b40b60b299563ad465f374d487a49",
    (1, 4, 64): "4cd602c0b989db8d0600afc065aded78ce922234f5840a3ab2e28df7a7ae547f",
    (1, 8, 32): "ca8d96643e6de4c79a7d9679ab25f3fbd99dade319f1ef1f2cbdb54f3a6fbe2e",
    (1, 8, 64): "1f61d93b0af4f5018f6d8b7ea64ac0b9ad17f0406c89d1326c3a73f2dbea9a76",
    (1, 8, 128): "197a54ec5a3cdcc40437507f1e2d2b696b37a9ccf4c67478c3dbc7088beb3b04",
    (2, 4, 32): "57efee3cc51dc5c42d61148a588f9e5411fc977e3f02449e39b89ca555016826",
    (2, 4, 64): "c4ed362f15db0f36f8e6a6dae6f35363fabbe6c2012dac37748e80a1a8ba6a2a",
    (2, 8, 32): "bb2dcdc52029b39801727fe10fffd13f1166e23248ba0bc1b1fb1868452c4568",
    (2, 8, 64): "b3f4e423e1bc5329d63394f224cbaec07ab7642db0c7dd1ca62cd4cc81a2dc25",
    (2, 8, 128): "d64a81875d76d8026c60bd81550740212ae84c6928d6be57ec604da934d27c21",
}


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{len(name)}:{name}:{len(files[name])}:".encode())
        h.update(files[name])
    return h.hexdigest()


def _untraced(header: bytes) -> bytes:
    """iket.cuh as a build without IKET reads it: the #else branch of its `#ifdef IKET`
    block (the empty macros). A timed kernel never defines IKET, so the tracer's own code
    and comments may change without touching any point's timing."""
    lines = header.split(b"\n")
    start = lines.index(b"#ifdef IKET")
    depth, branch = 0, None
    for i in range(start + 1, len(lines)):
        word = lines[i].split(b" ")[0]
        if word in (b"#if", b"#ifdef", b"#ifndef"):
            depth += 1
        elif word == b"#endif" and depth:
            depth -= 1
        elif word == b"#else" and not depth:
            branch = i + 1
        elif word == b"#endif":
            return b"\n".join(lines[branch:i])
    raise ValueError("iket.cuh: no complete #ifdef IKET block")


def _compiled_cuda(files: dict[str, bytes]) -> dict[str, bytes]:
    """The .cu files and the headers they include: what the point compiles (a header the
    family ships for other points, such as the wgmma one, does not change it), iket.cuh as
    an untraced build reads it."""
    include = re.compile(rb'#include "([^"]+)"')
    keep = {n for n in files if n.endswith(".cu")}
    while True:   # headers, and the headers they include
        more = {m.decode() for n in keep for m in include.findall(files[n])} & set(files)
        if more <= keep:
            return {n: _untraced(files[n]) if n == "iket.cuh" else files[n] for n in keep}
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
    "defaults": ({}, "3a7967aaa31ee6a7535da4bf2898d015f24514777f56cbe73027ace9ad354954"),
    "cp_async_s3": ({"walk_loads": "cp_async", "stages": 3},
                    "3b1cd4d6a15b3b57e7fabbe36c93d16884184c7e2af00a4b799847f9e4969cad"),
    "ut_state_bulk": ({"ut_product": "state", "stages": 2},
                      "9dc96cc9c3f2066d6f5b85d7eec05bbd5d5960ee4c6609d2da2481b600d912cf"),
    "deferred_fragments_direct_once": ({"out_store": "deferred", "w_gamma": "fragments", "t_bf16": "direct",
                                        "row_norms": "tensor_cores_once"},
                                       "904f46dc782f8a1c076b43b5af708afd96177760fafc5692fc2ed4e948318027"),
    "persistent": ({"prep_schedule": "persistent", "prep_order": "by_head"},
                   "a75f2696232f1006d9c0ed7830c4e395e203c59eccac6e6214c13495b6a72ecf"),
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


def test_the_tracer_lies_outside_the_pin():
    """An edit to iket.cuh's traced branch keeps every digest; one to the untraced macros
    does not."""
    header = (TEMPLATES / "common" / "iket.cuh").read_bytes()
    traced = header.replace(b"#ifdef IKET\n", b"#ifdef IKET\n#if 1\nstruct Edited {};\n#else\n#endif\n", 1)
    untraced = header.replace(b"#define IKET_BEGIN(var) do", b"#define IKET_BEGIN(var)  do", 1)
    assert traced != header and untraced != header
    assert _untraced(traced) == _untraced(header)
    assert _untraced(untraced) != _untraced(header)

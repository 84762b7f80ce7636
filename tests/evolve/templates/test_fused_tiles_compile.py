"""fused_tiles family: a space of over a thousand admitted points, inadmissible points
rejected before rendering, sampled points compile for sm_90a with the walk's wgmma issued
back to back (not serialised for want of registers), spills within the bound measured, and
IKET costs nothing when off. The two_pass templates it includes render two_pass's points as
before: test_two_pass_digests.py pins them."""
from __future__ import annotations

import itertools
import random

import pytest

from .conftest import FUSED_TILES_BEYOND, NVCC, TEMPLATES, compile_cubin, compile_ptx, needs_nvcc, parse_ptxas, text_bytes

# The prep keeps 256 - walk_regs registers a thread: 64 on the defaults. With w and ut staged
# (w_u_in_slot = 0) ptxas spills about 290 bytes in the prep's code (the two_pass prep, capped at
# 80, spills none on its defaults), 436 at 56 (walk_regs = 200); writing them over their operands
# in the slot spills under 64 (test below). The walk spills none. The check stage records each
# candidate's spills for the search.
SPILL_BOUND = 512


def _family():
    from evolve.families import load_family

    return load_family(TEMPLATES / "fused_tiles")


def test_space_and_defaults():
    fam = _family()
    assert fam.check(fam.defaults) == []
    assert sum(1 for _ in itertools.islice(fam.points(), 1000)) == 1000   # (walking all 364,032 takes 10 s)
    env = fam.environment(fam.defaults)
    assert env["prep_regs"] + env["walk_regs"] == 256   # two warpgroups of each role share 64 K registers
    assert env["smem_bytes"] <= 227 * 1024


@pytest.mark.parametrize("overrides, message", [
    ({"t_bf16": "direct", "diag_inverse": "after_blocks"}, "diag_inverse = 'in_blocks'"),
    ({"walk_regs": 176}, "walk_regs"),   # not a value: ptxas serialises the walk's wgmma below 192
    ({"prefetch_inputs": 1}, "one ring slot"),
    ({"chunk": 32}, "chunk"),
    ({"w_u_in_slot": 0}, "w_u_in_slot = 1"),        # early_qk (a default) needs the tiles w_u no longer reads
    ({"w_gamma": "fragments"}, "w_gamma's two ways one"),
    ({"side_poll": 1, "side_sixteenths": 0}, "side_sixteenths > 0"),
])
def test_constraints_reject(overrides, message):
    fam = _family()
    problems = fam.check({**fam.defaults, **overrides})
    assert problems, f"{overrides} should be rejected"
    assert any(message in p for p in problems), problems


def _sampled(n: int, seed: int) -> list[dict]:
    fam = _family()
    rng = random.Random(seed)
    return [fam.defaults] + [fam.sample(rng) for _ in range(n)]


@needs_nvcc
@pytest.mark.parametrize("index", range(4))
def test_sampled_points_compile(render_point, tmp_path, index):
    point = _sampled(3, 17)[index]
    cand, fam = render_point("fused_tiles", **point)
    env = fam.environment(point)
    text = compile_cubin(cand / "kda_fused_tiles.cu", tmp_path)
    assert "wgmma.mma_async instructions are serialized" not in text, text   # C7512
    assert "warpgroup.wait is injected" not in text, text                    # C7517
    r = parse_ptxas(text, "kda_fused_kernel")
    assert r.registers <= 128, r                 # the launch's count: 512 threads share 64 K
    assert r.spill_stores <= SPILL_BOUND and r.spill_loads <= SPILL_BOUND, (point, r)
    assert r.static_smem == 0                    # every tile lives in dynamic shared memory
    assert env["smem_bytes"] <= 227 * 1024


@needs_nvcc
def test_iket_is_free_when_off(render_point):
    cand, _ = render_point("fused_tiles")
    off = compile_ptx(cand / "kda_fused_tiles.cu")
    on = compile_ptx(cand / "kda_fused_tiles.cu", ("IKET=1",))
    assert "globaltimer" not in off and "iket_buffer" not in off
    assert "globaltimer" in on and "iket_buffer" in on and "iket_counts" in on   # the shares' counters
    assert "setmaxnreg.dec.sync.aligned.u32 64" in off and "setmaxnreg.inc.sync.aligned.u32 192" in off


@needs_nvcc
def test_roles_alone_builds(render_point, tmp_path):
    """KDA_ALONE (benchmarks/kda_roles.py's builds): each role alone compiles; the prep alone
    at the launch's 128 registers drops setmaxnreg and spills none, so it says what the prep
    costs at registers it cannot have beside the walk; the default build is the candidate's."""
    cand, _ = render_point("fused_tiles")
    src = cand / "kda_fused_tiles.cu"
    assert compile_ptx(src, ("KDA_ALONE=0",)) == compile_ptx(src)
    prep = compile_ptx(src, ("KDA_ALONE=1",))
    assert "setmaxnreg.dec.sync.aligned.u32 64" in prep and "wgmma" not in prep   # the walk's step left out
    walk = compile_ptx(src, ("KDA_ALONE=3",))
    assert "wgmma" in walk and "cp.async.cg" not in walk and "ex2" not in walk    # the prep's loads and gate left out
    full = compile_ptx(src, ("KDA_ALONE=2",))
    assert "setmaxnreg" not in full
    side = compile_ptx(src, ("KDA_ALONE=4",))   # the side kernel alone: the fused CTAs return at once
    assert "wgmma" not in side and "cp.async.cg" not in side and "bar.sync" not in side
    r = parse_ptxas(compile_cubin(src, tmp_path, ("KDA_ALONE=2",)), "kda_fused_kernel")
    assert r.spill_stores == 0 and r.spill_loads == 0, r


@needs_nvcc
@pytest.mark.parametrize("overrides", [{"side_sixteenths": 6}, {"side_sixteenths": 4, "elementwise": "bf16x2", "w_gamma": "fragments",
                                                           "t_bf16": "direct", "row_norms": "tensor_cores_once",
                                                           "w_u_in_slot": 0, "early_qk": 0}],
                         ids=["side6", "side4_prep_ways"])
def test_side_kernel_compiles(render_point, tmp_path, overrides):
    """The side prep: three teams of 256 threads in one CTA an SM, so at most 85 registers a
    thread (the launch's 768), its three work areas in dynamic shared memory, spills within the
    bound; and side chunks are constrained to two ring slots without prefetch_inputs."""
    cand, fam = render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, **overrides)
    env = fam.environment({**fam.defaults, **overrides})
    r = parse_ptxas(compile_cubin(cand / "kda_side_prep.cu", tmp_path), "kda_side_prep_kernel")
    assert r.registers <= 65536 // 768, r
    assert r.spill_stores <= 64 and r.spill_loads <= 64, r   # 8 and 12 bytes measured on the defaults' ways
    assert r.static_smem == 0 and env["side_smem_bytes"] <= 227 * 1024
    assert fam.check({**fam.defaults, "side_sixteenths": 6, "stages": 1})
    assert fam.check({**fam.defaults, "side_sixteenths": 6, "stages": 1, "prefetch_inputs": 1})


@needs_nvcc
def test_w_u_in_slot_spills_less(render_point, tmp_path):
    """w and ut over their operands in the slot: no staging tile's addresses and fragments, so the
    prep at 64 registers spills a fraction of what the staged way spills (measured: about 50
    bytes against 320 with this ptxas, 8 against 16 bytes of local memory with the GPU's NVRTC)."""
    spills = {}
    for slot in (0, 1):
        cand, _ = render_point("fused_tiles", w_u_in_slot=slot, early_qk=slot)
        (tmp_path / str(slot)).mkdir()
        r = parse_ptxas(compile_cubin(cand / "kda_fused_tiles.cu", tmp_path / str(slot)), "kda_fused_kernel")
        spills[slot] = r.spill_stores + r.spill_loads
    assert spills[1] <= 128 and 3 * spills[1] < spills[0], spills


@needs_nvcc
def test_side_poll_waits_after_the_step(render_point):
    """side_poll: the walk tests the next side chunk's flag once before a chunk's step (no spin
    there) and spins only where it was unset, after the step; without it, one spin before."""
    polled = compile_ptx(render_point("fused_tiles", side_poll=1)[0] / "kda_fused_tiles.cu")
    spun = compile_ptx(render_point("fused_tiles", side_poll=0)[0] / "kda_fused_tiles.cu")
    acquire, fence = "ld.acquire.gpu.global.u32", "fence.proxy.async.global"
    assert polled.count(acquire) == spun.count(acquire) + 1   # the test, and the spin (its first load peeled)
    assert polled.count(fence) == spun.count(fence) + 1
    assert polled.count("nanosleep") == spun.count("nanosleep") == 1   # one spin loop still


@needs_nvcc
def test_rolled_loops_shrink_both_kernels(render_point, tmp_path):
    """blocks_unroll (the fused kernel's), side_blocks_unroll (the side kernel's) and
    elementwise_unroll (both) roll the prep's M/P k-steps and elementwise rows: each kernel's
    machine code (what the SMs fetch through the level they share) shrinks, over 10 KB with the
    k-steps one a pass and 5 KB more with the rows four a pass, under the spill bound."""
    size, spills = {}, {}
    for unroll, rows in ((8, 16), (2, 16), (1, 16), (1, 4)):
        cand, _ = render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, blocks_unroll=unroll, side_blocks_unroll=unroll,
                               elementwise_unroll=rows)
        for src, kernel in (("kda_fused_tiles.cu", "kda_fused_kernel"), ("kda_side_prep.cu", "kda_side_prep_kernel")):
            out = tmp_path / f"{unroll}_{rows}_{kernel}"
            out.mkdir()
            r = parse_ptxas(compile_cubin(cand / src, out), kernel)
            size[unroll, rows, kernel] = text_bytes(out / (cand / src).with_suffix(".cubin").name, kernel)
            spills[unroll, rows, kernel] = r.spill_stores + r.spill_loads
    for kernel in ("kda_fused_kernel", "kda_side_prep_kernel"):
        assert size[1, 16, kernel] + 10_000 < size[8, 16, kernel], size   # measured: 16 KB less in each
        assert size[1, 16, kernel] <= size[2, 16, kernel] < size[8, 16, kernel], size
        assert size[1, 4, kernel] + 5_000 < size[1, 16, kernel], size     # measured: 7 KB less in each
        assert all(v <= SPILL_BOUND for k, v in spills.items() if k[2] == kernel), spills


def test_side_blocks_unroll_is_the_side_kernels_alone(render_point):
    """side_blocks_unroll renders only the side kernel's source differently, blocks_unroll only
    the fused kernel's."""
    base, _ = render_point("fused_tiles", blocks_unroll=1, side_blocks_unroll=1)
    side8, _ = render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, blocks_unroll=1, side_blocks_unroll=8)
    fused8, _ = render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, blocks_unroll=8, side_blocks_unroll=1)
    text = lambda cand, name: (cand / name).read_text()
    assert text(base, "kda_fused_tiles.cu") == text(side8, "kda_fused_tiles.cu")
    assert text(base, "kda_side_prep.cu") != text(side8, "kda_side_prep.cu")
    assert text(base, "kda_side_prep.cu") == text(fused8, "kda_side_prep.cu")
    assert text(base, "kda_fused_tiles.cu") != text(fused8, "kda_fused_tiles.cu")


def test_side_l2_prefetch_is_the_side_kernels_loads(render_point):
    """side_l2_prefetch: the side teams ask L2 for their next chunk's four tensors (two lines a
    row); the fused kernel's code is the same with it or without."""
    on, _ = render_point("fused_tiles", side_l2_prefetch=1)
    off, _ = render_point("fused_tiles", side_l2_prefetch=0)
    assert (on / "kda_fused_tiles.cu").read_text() == (off / "kda_fused_tiles.cu").read_text()
    if NVCC is None:
        pytest.skip("nvcc not installed")
    with_it = compile_ptx(on / "kda_side_prep.cu")
    without = compile_ptx(off / "kda_side_prep.cu")
    assert without.count("prefetch.global.L2") == 0
    assert with_it.count("prefetch.global.L2") == 2


@needs_nvcc
def test_two_side_teams_take_the_registers_three_share(render_point, tmp_path):
    """side_teams: three teams of 256 threads share an SM's 64 K registers at 80 a thread; two
    take up to 128, and spill nothing."""
    regs = {}
    for teams in (3, 2):
        cand, _ = render_point("fused_tiles", side_teams=teams)
        out = tmp_path / str(teams)
        out.mkdir()
        r = parse_ptxas(compile_cubin(cand / "kda_side_prep.cu", out), "kda_side_prep_kernel")
        regs[teams] = r.registers
        if teams == 2:
            assert r.spill_stores == r.spill_loads == 0, r
    assert regs[3] <= 80 < regs[2] <= 128, regs

"""Shared helpers for the KDA template tests: render a family point, compile it with nvcc."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TEMPLATES = REPO / "evolve" / "templates" / "kda"
NVCC = shutil.which("nvcc")
ARCH = "-gencode=arch=compute_90a,code=sm_90a"

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")


def load_solution(cand: Path):
    """A rendered candidate's solution.py as a module of its own (one per directory)."""
    spec = importlib.util.spec_from_file_location(f"_sol_{cand.name}", cand / "solution.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class PtxasReport:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int


def cupy_or_skip():
    """CuPy with a CUDA device, or skip the calling GPU test module."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device", allow_module_level=True)
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device", allow_module_level=True)
    return cupy


# The tiles prep's inverse parameters at the values the other preps take (two_pass's last
# constraint): the family's defaults are tiles values, so a full or lean point names these.
NOT_GRID = {"prep_order": "by_head"}   # the grid tiles prep's own way, at its only value elsewhere
NOT_BULK = {"walk_loads": "cp_async"}   # the wgmma walk's bulk loads from the tiles prep's ring image
NOT_TILES = {"diag_inverse": "after_blocks", "inverse_products": "fp32", "flush_denormals": 0, "elementwise": "fp32",
             "row_norms": "cuda_cores", "w_gamma": "tile", "t_bf16": "converted",
             **NOT_GRID, **NOT_BULK}


def for_prep(overrides: dict) -> dict:
    """A two_pass point's overrides, with the defaults of the tiles prep's own ways reset
    when it leaves that prep (NOT_TILES) or its grid schedule (NOT_GRID), and the bulk walk
    when it leaves the wgmma step (NOT_BULK)."""
    if overrides.get("prep_smem", "tiles") != "tiles":
        return {**NOT_TILES, **overrides}
    if overrides.get("state_step", "wgmma") != "wgmma":
        overrides = {**NOT_BULK, **overrides}
    if overrides.get("prep_schedule", "grid") != "grid":
        return {**NOT_GRID, **overrides}
    return overrides

def parse_ptxas(text: str, kernel: str) -> PtxasReport:
    """Resource lines of `kernel` from `-Xptxas -v` output."""
    start = text.index(f"Compiling entry function '{kernel}'")
    block = text[start:]
    nxt = block.find("Compiling entry function", 10)
    block = block if nxt < 0 else block[:nxt]
    spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
    regs = re.search(r"Used (\d+) registers", block)
    smem = re.search(r"(\d+) bytes smem", block)
    return PtxasReport(int(regs.group(1)), int(spills.group(2)), int(spills.group(3)), int(spills.group(1)),
                       int(smem.group(1)) if smem else 0)


def compile_cubin(source: Path, out_dir: Path, defines: tuple[str, ...] = ()) -> str:
    cmd = [NVCC, ARCH, "-cubin", "-Xptxas", "-v", "-std=c++17", *(f"-D{d}" for d in defines),
           "-o", str(out_dir / (source.stem + ".cubin")), str(source)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=source.parent)
    assert res.returncode == 0, f"nvcc failed for {source.name}:\n{res.stderr}"
    return res.stdout + res.stderr


def text_bytes(cubin: Path, kernel: str) -> int:
    """Bytes of `kernel`'s machine code in a cubin, as the check stage reads them."""
    from evolve.pipeline.nvcc import code_sizes

    sizes = code_sizes(cubin.read_bytes())
    if kernel not in sizes:
        raise KeyError(f"no .text.{kernel} in {cubin}")
    return sizes[kernel]


def compile_ptx(source: Path, defines: tuple[str, ...] = ()) -> str:
    out = source.with_suffix(".ptx")
    cmd = [NVCC, ARCH, "-ptx", "-std=c++17", *(f"-D{d}" for d in defines), "-o", str(out), str(source)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=source.parent)
    assert res.returncode == 0, res.stderr
    return out.read_text()


# fused_tiles values that left its space for measuring slower on an H100 (the side shares at the
# ends, the block products unrolled whole, the prep at 56 registers), which its tests still render:
# the template takes them
FUSED_TILES_BEYOND = {"side_sixteenths": [4, 8], "blocks_unroll": [8], "side_blocks_unroll": [8], "walk_regs": [200]}


@pytest.fixture
def render_point(tmp_path):
    from evolve.families import Family, load_family
    from evolve.render import render_candidate

    def render(family: str, beyond: dict | None = None, **overrides) -> tuple[Path, object]:
        """A point over the family's defaults; `beyond` adds values to a parameter's list, for
        points that left the space (measured slower) and that a test still compares against."""
        fam = load_family(TEMPLATES / family)
        if beyond:
            spec = fam.spec.model_copy(update={"parameters": {n: list(v) + list(beyond.get(n, ()))
                                                              for n, v in fam.spec.parameters.items()}})
            fam = Family(spec, fam.directory)
        params = {**fam.defaults, **overrides}
        return Path(render_candidate(fam, params, tmp_path / "cands")), fam

    return render

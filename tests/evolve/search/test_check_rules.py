from __future__ import annotations

import json
import shutil

import pytest

from evolve.digest import source_digest
from evolve.families import load_family
from evolve.pipeline import nvcc
from evolve.pipeline.static_rules import violations
from evolve.render import render_candidate


@pytest.mark.parametrize("source, needle", [
    ("import os\nos.system('ls')\n", "os.system"),
    ("import os as o\nf = o.popen\n", "os.popen"),
    ("from os import fork\n", "os.fork"),
    ("import subprocess\n", "subprocess"),
    ("from subprocess import run\n", "subprocess"),
    ("import socket\n", "socket"),
    ("import ctypes.util\n", "ctypes"),
    ("x = eval('1')\n", "eval"),
    ("m = __import__('os')\n", "__import__"),
    ("def f(:\n", "syntax error"),
])
def test_forbidden_constructs_are_found(source, needle):
    found = violations(source)
    assert found and any(needle in f for f in found), found


def test_clean_solution_passes():
    assert violations("import os\nimport numpy as np\nX = os.environ.get('A')\n"
                      "def setup(data, B, T, H):\n    return lambda: np.zeros(1)\n") == []


def test_ptxas_log_is_parsed():
    log = """ptxas info    : Compiling entry function 'k1' for 'sm_90a'
ptxas info    : Function properties for k1
    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 49152 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k2' for 'sm_90a'
ptxas info    : Function properties for k2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
"""
    ks = nvcc.parse_ptxas(log)
    assert ks["k1"].registers == 255 and ks["k1"].smem_bytes == 49152
    assert ks["k1"].spill_stores == 12 and ks["k1"].spill_loads == 16 and ks["k1"].stack_bytes == 8
    assert ks["k2"].registers == 10 and ks["k2"].smem_bytes == 0
    assert ks["k1"].performance_notes == [] and ks["k2"].performance_notes == []
    assert nvcc.gencode("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    with pytest.raises(ValueError):
        nvcc.gencode("sm90; rm -rf /")


def test_ptxas_performance_notes_are_kept_per_kernel():
    """ptxas 13.0's words (fused_tiles with too few walk registers, two_pass's walk before its
    fix): the note may come before its kernel's entry line, and names the kernel itself."""
    log = """ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the function 'kda_fused_kernel'
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kda_fused_kernel' for 'sm_90a'
ptxas info    : Function properties for kda_fused_kernel
    64 bytes stack frame, 92 bytes spill stores, 64 bytes spill loads
ptxas info    : Used 128 registers, used 16 barriers, 64 bytes cumulative stack size
ptxas info    : Compiling entry function 'kda_state_kernel' for 'sm_90a'
ptxas info    : (C7517) Potential Performance Loss: warpgroup.wait is injected in around line 370 by compiler to allow use of registers defined by GMMA in function 'kda_state_kernel'
ptxas info    : Used 232 registers, used 1 barriers
"""
    ks = nvcc.parse_ptxas(log)
    assert ks["kda_fused_kernel"].registers == 128 and ks["kda_fused_kernel"].spill_stores == 92
    assert ks["kda_fused_kernel"].performance_notes == [
        "C7512: wgmma.mma_async instructions are serialized due to insufficient register resources"]
    assert ks["kda_state_kernel"].registers == 232
    assert ks["kda_state_kernel"].performance_notes == [
        "C7517: warpgroup.wait is injected in around line 370 by compiler to allow use of registers defined by GMMA"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_nvcc_compiles_a_rendered_family_source(toy_family, tmp_path):
    fam = load_family(toy_family)
    out = render_candidate(fam, dict(fam.defaults, block=128, tile=2), tmp_path)
    rep = nvcc.compile_cuda(out / "kernel.cu", "sm_90a", [], timeout=120)
    assert rep.ok, rep.log
    assert rep.kernels["toy_kernel"].smem_bytes == 128 * 2 * 4
    assert rep.max_registers and rep.max_registers > 0
    (out / "kernel.cu").write_text("this is not CUDA\n")
    bad = nvcc.compile_cuda(out / "kernel.cu", "sm_90a", [], timeout=120)
    assert not bad.ok and "error" in bad.log


def _ctx(pop, client, workload_dir, families):
    from evolve.config import RunConfig
    from evolve.pipeline import GpuGate, StageContext
    wid = pop.ensure_workload(workload_dir.name, str(workload_dir))
    return StageContext(client=client, pop=pop, workload_id=wid, workload_dir=workload_dir, run_id=None,
                        stages=RunConfig.model_fields["stages"].default_factory(), families=families,
                        gate=GpuGate(client, 1, 4)), wid


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_check_stage_records_resources_and_refuses_bad_candidates(toy_family, tmp_path, pop, client):
    from evolve.pipeline import run_stage
    from evolve.population import NewCandidate

    workload = tmp_path / "gpu_workload"
    workload.mkdir()
    (workload / "workload.json").write_text('{"device": "cuda"}')
    fam = load_family(toy_family)
    ctx, wid = _ctx(pop, client, workload, {"toy": fam})

    def add(directory, family="toy"):
        params = json.loads((directory / "params.json").read_text())["params"]  # as a search registers it
        cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=family, params=params,
                                                 digest=source_digest(directory), directory=str(directory)))
        return cand

    good = add(render_candidate(fam, fam.defaults, tmp_path / "gen"))
    eid, res = run_stage(ctx, "check", good)
    assert res.status == "passed", res.message
    assert res.registers and res.spills == 0
    assert res.metrics["kernels"]["kernel.cu"]["toy_kernel"]["smem_bytes"] == 64 * 2 * 4
    assert pop.evaluation(eid).registers == res.registers

    broken = render_candidate(fam, dict(fam.defaults, block=32), tmp_path / "gen")
    (broken / "kernel.cu").write_text("__global__ void toy_kernel( {\n")
    _, res = run_stage(ctx, "check", add(broken))
    assert res.status == "failed" and res.failure_kind == "compile" and "kernel.cu" in res.message

    sneaky = render_candidate(fam, dict(fam.defaults, block=128), tmp_path / "gen")
    (sneaky / "solution.py").write_text("import subprocess\ndef setup(data, B, T, H):\n    return None\n")
    _, res = run_stage(ctx, "check", add(sneaky))
    assert res.status == "failed" and res.failure_kind == "check" and "subprocess" in res.message

    no_setup = render_candidate(fam, dict(fam.defaults, tile=1), tmp_path / "gen")
    (no_setup / "solution.py").write_text("X = 1\n")
    _, res = run_stage(ctx, "check", add(no_setup))
    assert res.status == "failed" and res.failure_kind == "import" and "setup" in res.message


def test_directory_rules_refuse_links_special_files_and_bytecode(tmp_path):
    import os

    from evolve.pipeline.static_rules import directory_violations

    (tmp_path / "solution.py").write_text("import numpy\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "util.py").write_text("import socket\n")
    os.mkfifo(tmp_path / "pipe")
    os.symlink("/etc/hostname", tmp_path / "link")
    (tmp_path / "helper.pyc").write_bytes(b"\0")
    (tmp_path / "__pycache__").mkdir()  # never sent, so never imported: ignored
    (tmp_path / "__pycache__" / "solution.cpython-311.pyc").write_bytes(b"\0")
    found = directory_violations(tmp_path)
    assert found == ["helper.pyc: compiled Python bytecode is not allowed (send the source)",
                     "link: symbolic links are not allowed", "pipe: not a regular file",
                     "sub/util.py:1: import of socket is not allowed"], found

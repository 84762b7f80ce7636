"""The check stage's nvcc is confined: a hostile candidate's sources cannot make it read a
host file into the stored stage message (red team: `#include "/tmp/.../secret.txt"`).

The CPU-only tests (the static include check, the sandbox's command line, the refusals)
always run; the compile tests need nvcc and a working bwrap and skip without them (CI has
no CUDA toolkit)."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evolve.db import open_database
from evolve.digest import source_digest
from evolve.pipeline import nvcc
from evolve.population import Population

SECRET = "ssh-rsa AAAA_ORCHESTRATOR_PRIVATE_KEY_MATERIAL"
SOLUTION = "def setup(data, B, T, H):\n    return lambda: None\n"
# The toy family's kernel (tests/evolve/search/conftest.py) at block 64, tile 2: 512 bytes smem.
KERNEL = ('#include "helper.cuh"\nextern "C" __global__ void toy_kernel(float* x) {\n'
          "  __shared__ float s[64 * 2];\n  s[threadIdx.x] = x[threadIdx.x];\n"
          "  __syncthreads();\n  x[threadIdx.x] = s[(64 - 1) - threadIdx.x % 64] * HELPER;\n}\n")


def _sandbox_reason() -> str | None:
    if nvcc.nvcc_path() is None:
        return "needs nvcc (the CUDA toolkit)"
    if nvcc.bwrap_path() is None:
        return "needs bwrap (bubblewrap)"
    return nvcc.sandbox_problem()


_REASON = _sandbox_reason()
needs_sandbox = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def _candidate(root: Path, name: str, kernel: str) -> Path:
    d = root / "agent" / name
    d.mkdir(parents=True)
    (d / "solution.py").write_text(SOLUTION)
    (d / "helper.cuh").write_text("#define HELPER 1\n")
    (d / "kernel.cu").write_text(kernel)
    return d


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "orchestrator" / "secret.txt"
    path.parent.mkdir()
    path.write_text(SECRET + "\n")
    return path


@pytest.fixture
def no_nvcc_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc 'installed' (a path that is never run): any subprocess run fails the test."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"ran {args[0] if args else kwargs}")
    monkeypatch.setattr(nvcc, "nvcc_path", lambda: "/opt/never/bin/nvcc")
    monkeypatch.setattr(nvcc.subprocess, "run", refuse)


# ---------------------------------------------------------------- CPU only
def test_static_check_refuses_absolute_and_parent_includes(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "kernel.cu").write_text('#include "helper.cuh"\n#include <cuda_fp16.h>\n'
                                        '  #  include "/etc/passwd"\n')
    (tmp_path / "helper.cuh").write_text('#include <../../etc/hostname>\n#include "a/b.h"\n')
    (tmp_path / "sub" / "x.inc").write_text('#include_next "sub/../../up.h"\n')
    (tmp_path / "part.h").write_text('#include "C:/secret"\n')
    (tmp_path / "solution.py").write_text('#include "/not/compiled"\n')  # a Python comment: nvcc never reads it
    found = nvcc.include_problems(tmp_path)
    assert found == [
        "helper.cuh:1: #include of a path with '..' is not allowed (include the candidate's own files by their relative name)",
        "kernel.cu:3: #include of an absolute path is not allowed (include the candidate's own files by their relative name)",
        "part.h:1: #include of an absolute path is not allowed (include the candidate's own files by their relative name)",
        "sub/x.inc:1: #include of a path with '..' is not allowed (include the candidate's own files by their relative name)",
    ], found
    assert not any("/etc" in f for f in found)  # the host path is not repeated


def test_bad_include_is_refused_before_nvcc_runs(tmp_path: Path, no_nvcc_run: None) -> None:
    d = _candidate(tmp_path, "abs", f'#include "{_secret(tmp_path)}"\n')
    with pytest.raises(nvcc.NvccRefused, match=r"kernel.cu:1: #include of an absolute path") as err:
        nvcc.compile_cuda(d / "kernel.cu", "sm_90a", [], timeout=60)
    assert SECRET not in str(err.value) and str(tmp_path) not in str(err.value)


def test_without_bwrap_nvcc_is_refused_not_run_unconfined(tmp_path: Path, no_nvcc_run: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvcc, "bwrap_path", lambda: None)
    d = _candidate(tmp_path, "plain", KERNEL)
    with pytest.raises(nvcc.NvccUnavailable, match="install bubblewrap"):
        nvcc.compile_cuda(d / "kernel.cu", "sm_90a", [], timeout=60)


def test_a_bwrap_that_cannot_build_the_sandbox_is_checked_again_until_it_can(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A failure is not remembered (it may be passing: a full /tmp, a namespace limit
    # reached for a moment); a success is.
    calls: list[list[str]] = []
    code = [1]

    def probe(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, code[0], "", "bwrap: No permissions to creating new namespace")
    monkeypatch.setattr(nvcc, "bwrap_path", lambda: "/opt/fake/bwrap")
    monkeypatch.setattr(nvcc.subprocess, "run", probe)
    monkeypatch.setattr(nvcc, "_WORKS", set())
    for _ in range(2):
        assert "No permissions to creating new namespace" in (nvcc.sandbox_problem() or "")
    code[0] = 0
    assert nvcc.sandbox_problem() is None and nvcc.sandbox_problem() is None
    assert len(calls) == 3 and calls[0][0] == "/opt/fake/bwrap"


def test_compile_runs_nvcc_only_through_the_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], dict[str, Any]]] = []

    def fake(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        seen.append((argv, kwargs))
        return subprocess.CompletedProcess(argv, 0)
    exe = str((tmp_path / "nowhere" / "bin" / "nvcc").resolve())  # no toolkit beside it: nothing more bound
    monkeypatch.setattr(nvcc, "nvcc_path", lambda: exe)
    monkeypatch.setattr(nvcc, "bwrap_path", lambda: "/usr/bin/bwrap")
    monkeypatch.setattr(nvcc, "sandbox_problem", lambda: None)
    monkeypatch.setattr(nvcc.subprocess, "run", fake)
    d = _candidate(tmp_path, "plain", KERNEL)
    rep = nvcc.compile_cuda(d / "kernel.cu", "sm_90a", ["-std=c++17"], timeout=60)
    (argv, kwargs), = seen
    end = argv.index("--")
    assert argv[:end + 1] == nvcc.sandbox_argv("/usr/bin/bwrap", d, Path(argv[argv.index("--bind") + 1]), None)
    nv = [exe, "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-Xptxas", "-v", "-std=c++17",
          "-I", ".", "-o", f"{nvcc.SANDBOX_SCRATCH}/out.cubin", "kernel.cu"]
    assert argv[end + 1:] == nvcc.limited(nv, nvcc.MEMORY_LIMIT_BYTES)
    assert kwargs["env"] == nvcc.sandbox_env(None) and kwargs["stdin"] == subprocess.DEVNULL
    assert kwargs["timeout"] == 60 and rep.ok and rep.command == nv[1:]


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_sandbox_command_line(tmp_path: Path) -> None:
    src, scratch = tmp_path / "cand", tmp_path / "scratch"
    argv = nvcc.sandbox_argv("/usr/bin/bwrap", src, scratch, "/opt/cuda-13.0")
    assert argv[0] == "/usr/bin/bwrap" and argv[-1] == "--"
    for flag in ("--unshare-all", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--proc") + 1] == "/proc" and argv[argv.index("--dev") + 1] == "/dev"
    assert argv[argv.index("--chdir") + 1] == nvcc.SANDBOX_SOURCE
    # The only writable host folder is the scratch one; the candidate's is read-only.
    assert _pairs(argv, "--bind") == [(str(scratch), nvcc.SANDBOX_SCRATCH)]
    ro = _pairs(argv, "--ro-bind")
    assert (str(src), nvcc.SANDBOX_SOURCE) in ro and ("/opt/cuda-13.0", "/opt/cuda-13.0") in ro
    assert all(h == i for h, i in ro if i != nvcc.SANDBOX_SOURCE)
    hosts = {h for h, _ in ro}
    assert not hosts & {"/", "/etc", "/tmp", "/root", "/home", "/proc", str(Path.home())}, hosts
    assert all(h.startswith(("/usr", "/bin", "/sbin", "/lib", "/etc/ld.so", "/etc/alternatives"))
               for h in hosts - {str(src), "/opt/cuda-13.0"}), hosts
    # /tmp is the sandbox's own tmpfs, and the toolkit is bound after it (so one under /tmp shows).
    assert argv.index("--tmpfs") < argv.index("/opt/cuda-13.0") and argv[argv.index("--tmpfs") + 1] == "/tmp"


def test_memory_limit_and_environment() -> None:
    assert nvcc.limited(["nvcc", "-v"], 8 << 30) == [
        "/bin/sh", "-c", 'ulimit -v "$1" && ulimit -f "$2" && shift 2 && exec "$@"', "nvcc-limit", str(8 << 20),
        str(2 << 20), "nvcc", "-v"]


def test_nothing_nvcc_spawns_writes_a_file_past_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The scratch folder is on the host's disk: a template blow-up could fill it.
    monkeypatch.setattr(nvcc, "FILE_LIMIT_BYTES", 1 << 20)
    out = tmp_path / "big"
    proc = subprocess.run(nvcc.limited(["/bin/sh", "-c", f"head -c {4 << 20} /dev/zero > {out}"], 1 << 30),
                          capture_output=True)
    assert proc.returncode != 0 and out.stat().st_size <= 2 << 20
    env = nvcc.sandbox_env("/opt/cuda-13.0")
    assert set(env) == {"PATH", "LANG", "LC_ALL", "TMPDIR", "HOME"}
    assert env["PATH"].startswith("/opt/cuda-13.0/bin:") and env["TMPDIR"] == nvcc.SANDBOX_SCRATCH


def test_toolkit_root_binds_only_a_toolkit(tmp_path: Path) -> None:
    tk = tmp_path / "cuda"
    (tk / "bin").mkdir(parents=True)
    (tk / "nvvm").mkdir()
    (tk / "bin" / "nvcc").write_text("")
    assert nvcc.toolkit_root(str(tk / "bin" / "nvcc")) == str(tk.resolve())
    home = tmp_path / "home" / ".local"
    (home / "bin").mkdir(parents=True)
    assert nvcc.toolkit_root(str(home / "bin" / "nvcc")) is None  # no nvvm: not a toolkit, not shown


def test_log_names_files_relative_to_the_candidate(tmp_path: Path) -> None:
    cand, scratch = tmp_path / "cand", tmp_path / "scratch"
    log = (f"{cand}/kernel.cu(3): error\n/src/helper.cuh(1): note\n/scratch/tmpxft_1.cpp: x\n"
           f"{scratch}/out.cubin\n/usr/src/linux/x.h and /usr/local/cuda/include/cuda.h\n")
    assert nvcc._relative(log, [cand, scratch]) == (
        "kernel.cu(3): error\nhelper.cuh(1): note\ntmpxft_1.cpp: x\nout.cubin\n"
        "/usr/src/linux/x.h and /usr/local/cuda/include/cuda.h\n")


# ---------------------------------------------------------------- with nvcc and bwrap
@needs_sandbox
def test_a_normal_kernel_compiles_confined_and_is_measured(tmp_path: Path) -> None:
    d = _candidate(tmp_path, "good", KERNEL)
    rep = nvcc.compile_cuda(d / "kernel.cu", "sm_90a", [], timeout=120)
    assert rep.ok, rep.log
    k = rep.kernels["toy_kernel"]
    assert k.registers > 0 and k.smem_bytes == 64 * 2 * 4 and k.spill_stores == k.spill_loads == 0
    assert 0 < k.code_bytes < 4096 and k.code_bytes % 16 == 0   # a handful of 16-byte instructions
    assert str(tmp_path) not in rep.log + " ".join(rep.command)
    (d / "kernel.cu").write_text("this is not CUDA\n")
    bad = nvcc.compile_cuda(d / "kernel.cu", "sm_90a", [], timeout=120)
    assert not bad.ok and "kernel.cu" in bad.log and "error" in bad.log and str(tmp_path) not in bad.log


@needs_sandbox
def test_macro_include_of_a_host_file_is_stopped_by_the_sandbox(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    d = _candidate(tmp_path, "macro", f'#define P "{secret}"\n#include P\n' + KERNEL)
    assert nvcc.include_problems(d) == []  # the static check cannot see through the macro
    rep = nvcc.compile_cuda(d / "kernel.cu", "sm_90a", [], timeout=120)
    assert not rep.ok and SECRET not in rep.log
    assert "No such file" in rep.log  # the host file does not exist inside the sandbox


@needs_sandbox
def test_memory_limit_reaches_what_nvcc_spawns(tmp_path: Path) -> None:
    d = _candidate(tmp_path, "small", KERNEL)
    rep = nvcc.compile_cuda(d / "kernel.cu", "sm_90a", [], timeout=120, memory_bytes=48 << 20)
    assert not rep.ok and not rep.kernels


@pytest.fixture
def pop(tmp_path: Path) -> Iterator[Population]:
    database = open_database(f"sqlite:///{tmp_path / 'evolve.db'}")
    yield Population(database)
    database.close()


@needs_sandbox
def test_check_stage_stores_no_host_file(tmp_path: Path, pop: Population, client: Any) -> None:
    from evolve.config import default_stages
    from evolve.pipeline import GpuGate, StageContext, run_stage
    from evolve.population import NewCandidate
    from evolve.vocabulary import Stage

    workload = tmp_path / "gpu_workload"
    workload.mkdir()
    (workload / "workload.json").write_text('{"device": "cuda"}')  # nvcc runs for CUDA workloads only
    wid = pop.ensure_workload(workload.name, str(workload))
    # The context as tests/evolve/search/test_check_rules.py builds it.
    ctx = StageContext(client=client, pop=pop, workload_id=wid, workload_dir=workload, run_id=None,
                       stages=default_stages(), families={}, gate=GpuGate(client, 1, 4))

    def check(d: Path) -> tuple[Any, str]:
        cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=source_digest(d),
                                                 directory=str(d), name=d.name))
        eid, res = run_stage(ctx, Stage.CHECK, cand)
        assert eid is not None
        evaluation = pop.evaluation(eid)
        assert evaluation is not None
        return res, evaluation.message or ""

    secret = _secret(tmp_path)
    direct = _candidate(tmp_path, "direct", f'#include "{secret}"\n' + KERNEL)
    res, stored = check(direct)
    assert res.failure_kind == "check" and "absolute path" in stored, stored
    assert SECRET not in stored
    assert str(direct) not in stored

    # nvcc echoes the candidate's own line (the path it wrote), never the file's content
    # nor where the candidate lies on the host.
    macro = _candidate(tmp_path, "macro", f'#define P "{secret}"\n#include P\n' + KERNEL)
    res, stored = check(macro)
    assert res.failure_kind == "compile" and "kernel.cu" in stored, stored
    assert SECRET not in stored
    assert str(macro) not in stored

    res, stored = check(_candidate(tmp_path, "good", KERNEL))
    assert res.status == "passed", stored
    assert res.registers and res.spills == 0
    assert res.metrics["kernels"]["kernel.cu"]["toy_kernel"]["smem_bytes"] == 64 * 2 * 4


# ---------------------------------------------------------------- code sizes from a cubin
def _elf(sections: list[tuple[str, int]], shstrndx: int | None = None) -> bytes:
    """A minimal ELF64 file: a null section, the given (name, size) sections, then the names."""
    import struct

    names = b"\0" + b"".join(n.encode() + b"\0" for n, _ in sections) + b".shstrtab\0"
    offsets, at = [], 1
    for n, _ in sections:
        offsets.append(at)
        at += len(n) + 1
    shoff = 64 + len(names)
    headers = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    headers += [struct.pack("<IIQQQQIIQQ", off, 1, 6, 0, 0, size, 0, 0, 16, 0) for off, (_, size) in zip(offsets, sections)]
    headers.append(struct.pack("<IIQQQQIIQQ", at, 3, 0, 0, 64, len(names), 0, 0, 1, 0))
    n = len(headers)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, n,
                                 n - 1 if shstrndx is None else shstrndx)
    return header + names + b"".join(headers)


def test_code_sizes_read_each_kernels_text_section() -> None:
    cubin = _elf([(".text.kda_fused_kernel", 96512), (".nv.info", 40), (".text.side", 73216)])
    assert nvcc.code_sizes(cubin) == {"kda_fused_kernel": 96512, "side": 73216}


@pytest.mark.parametrize("mangle", ["empty", "not_elf", "elf32", "truncated", "names_past_end", "bad_index"])
def test_code_sizes_of_a_malformed_cubin_are_none(mangle: str) -> None:
    cubin = _elf([(".text.k", 64)])
    bad = {"empty": b"", "not_elf": b"MZ" + cubin[2:], "elf32": cubin[:4] + b"\x01" + cubin[5:],
           "truncated": cubin[:-10], "bad_index": _elf([(".text.k", 64)], shstrndx=7),
           "names_past_end": cubin[:-64] + cubin[-64:-40] + (10**9).to_bytes(8, "little") + cubin[-32:]}[mangle]
    assert nvcc.code_sizes(bad) == {}

"""Compile CUDA sources with nvcc for the server's target and read ptxas resource usage."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


class KernelResources(BaseModel):
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    smem_bytes: int = 0


class CompileReport(BaseModel):
    ok: bool
    arch: str
    command: list[str] = Field(default_factory=list)
    log: str = ""
    kernels: dict[str, KernelResources] = Field(default_factory=dict)

    @property
    def max_registers(self) -> int | None:
        return max((k.registers for k in self.kernels.values()), default=None)

    @property
    def total_spills(self) -> int | None:
        return sum(k.spill_stores + k.spill_loads for k in self.kernels.values()) if self.kernels else None


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    kernels: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = kernels.setdefault(m.group(1), KernelResources())
            continue
        if current is None:
            continue
        m = _SPILL.search(line)
        if m:
            current.stack_bytes, current.spill_stores, current.spill_loads = (int(g) for g in m.groups())
        m = _USED.search(line)
        if m:
            current.registers = int(m.group(1))
            s = _SMEM.search(line)
            current.smem_bytes = int(s.group(1)) if s else 0
    return kernels


def gencode(arch: str) -> str:
    """`sm_90a` -> `-gencode=arch=compute_90a,code=sm_90a`."""
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise ValueError(f"unexpected GPU arch {arch!r}")
    return f"-gencode=arch=compute_{arch[3:]},code={arch}"


def compile_cuda(source: Path, arch: str, extra_flags: list[str], timeout: float) -> CompileReport:
    """nvcc -cubin -Xptxas -v; the include path is the source's folder."""
    exe = nvcc_path()
    if exe is None:
        raise FileNotFoundError("nvcc not found")
    with tempfile.TemporaryDirectory(prefix="evolve-nvcc-") as tmp:
        cmd = [exe, gencode(arch), "-cubin", "-Xptxas", "-v", *extra_flags,
               "-I", str(source.parent), "-o", str(Path(tmp) / "out.cubin"), str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=source.parent)
    log = (proc.stdout + proc.stderr)[-16000:]
    return CompileReport(ok=proc.returncode == 0, arch=arch, command=cmd[1:], log=log,
                         kernels=parse_ptxas(log) if proc.returncode == 0 else {})

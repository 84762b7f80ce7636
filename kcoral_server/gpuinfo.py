"""What the host offers: visible GPUs, their architecture, tool versions (for /health)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def detect_gpus() -> list[int]:
    """Indices of the GPUs this server may use (honours CUDA_VISIBLE_DEVICES if numeric)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in items):
            return [int(v) for v in items]
    out = _run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"])
    if not out:
        return []
    return [int(line) for line in out.split() if line.strip().isdigit()]


def target_arch(gpu_ids: list[int]) -> dict[str, str]:
    if not gpu_ids:
        return {}
    out = _run(["nvidia-smi", f"--id={gpu_ids[0]}", "--query-gpu=compute_cap", "--format=csv,noheader"])
    if not out or not re.match(r"^\d+\.\d+$", out.strip()):
        return {}
    major, minor = out.strip().split(".")
    arch = f"sm_{major}{minor}"
    # Hopper and Blackwell datacentre parts have arch-specific ("a") features kernels target.
    if int(major) in (9, 10):
        arch += "a"
    return {"arch": arch}


def versions(with_gpu: bool) -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version()}
    for dist in ("kcoral-evolve", "numpy", "ml_dtypes", "starlette", "uvicorn"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy"):
        try:
            out["cupy"] = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    nvcc = _run(["nvcc", "--version"])
    if nvcc:
        m = re.search(r"release ([\d.]+)", nvcc)
        if m:
            out["nvcc"] = m.group(1)
    if with_gpu:
        drv = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if drv:
            out["driver"] = drv.split()[0]
    return out

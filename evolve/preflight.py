"""What a run checks before its first candidate: that the server can run this workload
and has what its families need. Each problem is one line. (A missing local nvcc is not
one: the check stage records the compile as skipped and the server still judges.)"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evolve.config import RunConfig
from evolve.families import Family

CPU_DEVICES = ("cpu",)


class PreflightError(RuntimeError):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def workload_device(workload_dir: Path) -> str:
    try:
        return str(json.loads((workload_dir / "workload.json").read_text()).get("device", "cpu"))
    except (OSError, ValueError):
        return "cpu"


def health_gpus(health: dict[str, Any]) -> int:
    """GPUs behind a server. A router reports no `gpu_count` (null): its nodes' CUDA target
    (e.g. {"arch": "sm_90a"}) says they have GPUs, its request capacity how many slots."""
    count = health.get("gpu_count")
    if count is None and health.get("target"):
        capacity = (health.get("load") or {}).get("request_capacity")
        return capacity if isinstance(capacity, int) and capacity > 0 else 1
    return int(count or 0)


def problems(config: RunConfig, health: dict[str, Any], families: dict[str, Family]) -> list[str]:
    found: list[str] = []
    if health.get("status") not in (None, "ok"):
        found.append(f"the server is {health.get('status')!r}, not accepting work")
    device = workload_device(config.workload_dir)
    gpus = health_gpus(health)
    if device not in CPU_DEVICES and gpus == 0:
        found.append(f"workload {config.workload_name} runs on device {device!r} but the server has no GPU "
                     "(point --remote at a GPU server, or use a CPU workload)")
    if device in CPU_DEVICES and gpus > 0 and not health.get("virtual_gpus"):
        found.append(f"workload {config.workload_name} is a CPU workload but the server runs on GPUs")
    cuda = sorted(name for name, fam in families.items() if fam.spec.cuda_sources)
    versions = health.get("versions") or {}
    if cuda and gpus > 0 and not health.get("virtual_gpus") and "cupy" not in versions:
        found.append(f"families {cuda} load CUDA kernels with CuPy, which the server does not have "
                     "(pip install -e '.[gpu]' where the server runs)")
    return found

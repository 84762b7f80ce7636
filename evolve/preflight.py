"""What a run checks before its first candidate: that the server can run this workload
and has what its families and enabled stages need. Each problem is one line. (A missing
local nvcc is not one: the check stage records the compile as skipped and the server
still judges; a local nvcc without the bubblewrap sandbox it runs in is.)"""
from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcoral.remote import SendSpec, run_python
from kcoral.runners.tool_runner import NCU_PATTERNS

from evolve.config import RunConfig
from evolve.families import Family
from evolve.pipeline import nvcc
from evolve.vocabulary import TOOL_STAGES, Stage

# Asks the server where ncu is, the way its tool runner looks for it (PATH, then NCU_PATTERNS).
NCU_PROBE = f"""import glob, json, shutil
found = shutil.which("ncu") or next((h[-1] for h in (sorted(glob.glob(p)) for p in {NCU_PATTERNS!r}) if h), None)
print(json.dumps({{"ncu": found}}))
"""

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
    if cuda and nvcc.nvcc_path() is not None and (why := nvcc.sandbox_problem()) is not None:
        # Else every candidate would fail its check stage, one by one.
        found.append(f"families {cuda}: {why}")
    return found


def tool_problems(config: RunConfig, health: dict[str, Any], families: dict[str, Family],
                  find_ncu: Callable[[], str | None]) -> list[str]:
    """The iket and ncu stages, when enabled: a GPU server, an app that every family's
    candidates hold, and (ncu) Nsight Compute where the server can find it."""
    enabled = [s for s in TOOL_STAGES if config.stages[s].enabled]
    if not enabled:
        return []
    found: list[str] = []
    if int(health.get("gpu_count") or 0) == 0 and not health.get("virtual_gpus"):
        return [f"stages {', '.join(enabled)} are enabled but the server has no GPU (they profile or trace CUDA "
                "kernels): disable them in the config's [stages] or point --remote at a GPU server"]
    for stage in enabled:
        app = config.stages[stage].app
        if not app:
            found.append(f"stage {stage} is enabled but gives no app (the command run in the candidate's folder)")
        elif app[-1].endswith(".py"):
            lacking = sorted(name for name, fam in families.items() if app[-1] not in fam.output_names())
            if lacking:
                found.append(f"stage {stage} runs {app[-1]} in the candidate's folder, but the candidates of "
                             f"families {lacking} have no such file (add it to the family's render or copy list)")
    if Stage.NCU in enabled:
        try:
            where = find_ncu()
        except Exception as exc:  # noqa: BLE001 - any failure of the probe is one line here
            return [*found, f"stage ncu: could not ask the server whether it has Nsight Compute: {exc}"]
    if Stage.NCU in enabled and where is None:
        found.append("stage ncu is enabled but the server has no Nsight Compute: ncu is not on its PATH nor in "
                     + ", ".join(NCU_PATTERNS))
    return found


def probe_ncu(client: Any, timeout: float = 60) -> str | None:
    """Where the server finds ncu, or None (a small Python program run there)."""
    with tempfile.TemporaryDirectory(prefix="evolve-preflight-") as tmp:
        (Path(tmp) / "probe_ncu.py").write_text(NCU_PROBE)
        res = run_python(client, [SendSpec(Path(tmp))], "probe_ncu.py", timeout=timeout)
    if res.exit_code != 0:
        raise RuntimeError(f"the ncu probe failed on the server (exit {res.exit_code}): {res.stderr[-500:]}")
    return json.loads(res.stdout.strip().splitlines()[-1]).get("ncu")

"""Run this candidate on random inputs with in-kernel event tracing.

Run under IKET=1 IKET_OUT=DIR (what `kcoral iket` sets): the solution compiles its
kernels with -DIKET=1 and dumps <kernel>.iket.bin / .iket.json into DIR after each call.
Environment: T (default 2048), H (96), B (1), ITERS (1), SEED (0).
"""
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import cupy

HERE = Path(__file__).resolve().parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_capture_{name}", HERE / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name}.py beside this script")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


if os.environ.get("IKET") != "1":
    print("IKET is not set to 1: the kernels run untraced and no trace is written")
launch = _load("kda_launch")
solution = _load("solution")

B, T, H = launch.env_int("B", 1), launch.env_int("T", 2048), launch.env_int("H", 96)
data = launch.random_inputs(B, T, H, seed=launch.env_int("SEED", 0))
fn = solution.setup(data, B, T, H)   # setup's warm-up call is traced too
for _ in range(launch.env_int("ITERS", 1)):
    fn()
cupy.cuda.get_current_stream().synchronize()
print(f"traced B={B} T={T} H={H} into {os.environ.get('IKET_OUT', '.')}")

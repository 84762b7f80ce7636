"""Run this candidate a few times on random inputs, with in-kernel event tracing (run under IKET=1 IKET_OUT=DIR).

Environment: T (default 2048), H (96), B (1), ITERS (1), SEED (0).
"""
import importlib.util
from pathlib import Path

import cupy

HERE = Path(__file__).resolve().parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_capture_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


launch = _load("kda_launch")
solution = _load("solution")

B, T, H = launch.env_int("B", 1), launch.env_int("T", 2048), launch.env_int("H", 96)
data = launch.random_inputs(B, T, H, seed=launch.env_int("SEED", 0))
fn = solution.setup(data, B, T, H)
for _ in range(launch.env_int("ITERS", 1)):
    fn()
cupy.cuda.get_current_stream().synchronize()
print(f"ran B={B} T={T} H={H}; output finite: {bool(cupy.isfinite(launch.bf16_to_f32(data['output'])).all())}")
import os

if os.environ.get("IKET") != "1":
    print("IKET is not set: no trace was written")

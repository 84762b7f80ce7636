"""Compile and launch helpers shared by the KDA candidates (CuPy + NVRTC).

Sources are compiled once per process. Local ``#include "..."`` headers are inlined
before compiling, so the source text CuPy hashes for its on-disk kernel cache
(``CUPY_CACHE_DIR``, keyed by source, options and target) covers every header: an edit
to a header is a new cache entry, and a second process reuses the compiled module.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy

try:
    import cupy
except ImportError:  # the source helpers below still work on a machine without CuPy
    cupy = None

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", re.M)
_modules: dict = {}


def inline_includes(path: Path, _seen: set[Path] | None = None) -> str:
    """The source at ``path`` with its local includes pasted in, each header once."""
    seen = set() if _seen is None else _seen
    path = Path(path).resolve()
    seen.add(path)

    def paste(m: re.Match) -> str:
        header = (path.parent / m.group(1)).resolve()
        if header in seen:
            return ""
        return inline_includes(header, seen)

    return _INCLUDE.sub(paste, _PRAGMA_ONCE.sub("", path.read_text()))


def compile_options(defines: tuple[str, ...] = ()) -> tuple[str, ...]:
    # CuPy adds the device's -arch itself; mma.sync, ldmatrix and cp.async need sm_80+.
    return ("-std=c++17", *(f"-D{d}" for d in defines))


def load_module(path: Path, defines: tuple[str, ...] = (), *, arch_specific: bool = False) -> Any:
    """The compiled module of the source at ``path``.

    ``arch_specific``: the source uses instructions of one architecture only (Hopper's
    wgmma needs ``sm_90a``). CuPy compiles for the plain ``sm_90`` and appends its own
    ``-arch``, so such sources are compiled here with NVRTC to a cubin, cached on disk
    beside CuPy's own kernel cache."""
    src = inline_includes(path)
    opts = compile_options(defines)
    key = hashlib.sha256("\0".join((src, *opts, str(arch_specific))).encode()).hexdigest()
    mod = _modules.get(key)
    if mod is None:
        if arch_specific:
            mod = cupy.RawModule(path=str(_arch_specific_cubin(src, opts, key)))
        else:
            mod = cupy.RawModule(code=src, options=opts, backend="nvrtc")
        _modules[key] = mod
    return mod


def _arch_specific_cubin(src: str, opts: tuple[str, ...], key: str) -> Path:
    from cupy_backends.cuda.libs import nvrtc

    arch = f"sm_{cupy.cuda.Device().compute_capability}a"
    cache = Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")
    cubin = cache / f"kda_{arch}_{nvrtc.getVersion()[0]}_{key[:32]}.cubin"
    if cubin.exists():
        return cubin
    prog = nvrtc.createProgram(src, "kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*opts, f"--gpu-architecture={arch}"])
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"NVRTC ({arch}) failed:\n{nvrtc.getProgramLog(prog)}") from e
        data = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cubin.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, cubin)   # another process compiling the same source writes the same bytes
    return cubin


def get_kernel(module: Any, name: str, smem_bytes: int) -> Any:
    kern = module.get_function(name)
    if smem_bytes > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem_bytes
    return kern


def ptr(a: Any) -> numpy.uint64:
    """A device array as a raw pointer argument (bf16 arrays are read as raw bits)."""
    return numpy.uint64(a.data.ptr)


def _bf16_dtype():
    try:
        import ml_dtypes

        cupy.empty(1, dtype=ml_dtypes.bfloat16)
        return ml_dtypes.bfloat16
    except Exception:  # noqa: BLE001 - an older CuPy without bfloat16: keep raw uint16 bits
        return cupy.uint16


def to_bf16(x):
    """float32 -> bf16 (round to nearest even), as CuPy's bf16 dtype when it has one."""
    bits = cupy.ascontiguousarray(x, dtype=cupy.float32).view(cupy.uint32)
    rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) >> 16
    return rounded.astype(cupy.uint16).view(_bf16_dtype())


def bf16_to_f32(x):
    return (x.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32)


def random_inputs(B: int, T: int, H: int, seed: int = 0, K: int = 128) -> dict:
    """Inputs drawn like the scored case, plus preallocated NaN outputs."""
    rs = cupy.random.RandomState(seed)
    data = {n: to_bf16(rs.standard_normal((B, T, H, K), dtype=cupy.float32) * 0.5) for n in "qkvg"}
    data["beta"] = to_bf16(rs.standard_normal((B, T, H), dtype=cupy.float32) * 0.5)
    data["A_log"] = cupy.log(rs.uniform(1, 16, H)).astype(cupy.float32)
    dt = cupy.maximum(cupy.exp(rs.uniform(numpy.log(1e-3), numpy.log(0.1), H * K)), 1e-4)
    data["dt_bias"] = (dt + cupy.log(-cupy.expm1(-dt))).astype(cupy.float32)
    data["scale"] = K ** -0.5
    data["initial_state"] = rs.standard_normal((B, H, K, K), dtype=cupy.float32) * 0.25
    data["output"] = to_bf16(cupy.full((B, T, H, K), numpy.nan, dtype=cupy.float32))
    data["final_state"] = cupy.full((B, H, K, K), numpy.nan, dtype=cupy.float32)
    return data


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))

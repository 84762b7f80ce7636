"""Uploaded in place of a CUDA-source module on a server without our CUDA builtins.

`kcoral.compat` turns `upload(language="cuda")` + `run("builtin.compile_cuda", ...)` into
this module (with `CUDA_SOURCE` set to the uploaded text) and a run of its
`compile_cuda(options)`, which compiles with what the worker has: CuPy's NVRTC
(`RawModule`), else torch's (`torch.cuda._compile_kernel`, a stock GPU worker's). The
kernel it returns is launched as the builtin's is: `kernel(grid, block, *args)`, Python
ints as int32, floats as float32, device arrays as pointers. Standard library only at
import time: the worker imports the compilers when the program asks for one.
"""
from __future__ import annotations

from typing import Any

CUDA_SOURCE = ""  # set by the client


def _dim3(value: Any) -> tuple[int, int, int]:
    dims = [int(value)] if isinstance(value, int) else [int(v) for v in value]
    if not 1 <= len(dims) <= 3:
        raise ValueError("grid and block take an int or a list of 1 to 3 ints")
    x, y, z = (dims + [1, 1])[:3]
    return (x, y, z)


def _options(opts: Any) -> tuple[str, list[str]]:
    opts = {"name": opts} if isinstance(opts, str) else (opts or {})
    name, flags = opts.get("name"), opts.get("options", [])
    if not isinstance(name, str) or not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise TypeError('compile_cuda takes {"name": kernel, "options": [str, ...]}')
    return name, flags


def _cupy_kernel(cupy: Any, name: str, flags: list[str]) -> Any:
    kernel = cupy.RawModule(code=CUDA_SOURCE, options=tuple(flags)).get_function(name)

    def launch(grid: Any, block: Any, *args: Any) -> None:
        import numpy

        def convert(a: Any) -> Any:
            if isinstance(a, bool):
                return numpy.bool_(a)
            if isinstance(a, int):
                return numpy.int32(a)
            if isinstance(a, float):
                return numpy.float32(a)
            if hasattr(a, "__cuda_array_interface__") and not isinstance(a, cupy.ndarray):
                return cupy.asarray(a)  # a torch tensor: same memory, seen by CuPy
            return a

        kernel(_dim3(grid), _dim3(block), tuple(convert(a) for a in args))

    return launch


def _torch_kernel(torch: Any, name: str, flags: list[str]) -> Any:
    kernel = torch.cuda._compile_kernel(CUDA_SOURCE, name, nvcc_options=flags or None)

    def launch(grid: Any, block: Any, *args: Any) -> None:
        kernel(grid=_dim3(grid), block=_dim3(block), args=list(args))

    return launch


def compile_cuda(opts: Any = None) -> Any:
    name, flags = _options(opts)
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        return _cupy_kernel(cupy, name, flags)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel"):
        return _torch_kernel(torch, name, flags)
    raise RuntimeError("compiling CUDA here needs CuPy or a CUDA build of torch (with "
                       "torch.cuda._compile_kernel) in the worker; this worker has neither")

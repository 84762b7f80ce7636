"""Exceptions that end a program with a specific FAILED kind (raised inside a worker)."""
from __future__ import annotations


class ProgramFailure(Exception):
    kind = "runtime"


class Unavailable(ProgramFailure):
    kind = "unavailable"


class CorrectnessFailure(ProgramFailure):
    kind = "correctness"


class CompileFailure(ProgramFailure):
    kind = "compile"


class GpuAccessFailure(ProgramFailure):
    kind = "gpu_access"

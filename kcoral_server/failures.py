"""Exceptions that end a program with a specific FAILED kind (raised inside a worker)."""
from __future__ import annotations

from enum import Enum


class ErrorKind(str, Enum):
    """FAILED kinds, with the released protocol's meanings."""

    PARSE = "parse"                  # module source that does not compile or execute; a missing name
    COMPILE = "compile"              # builtin.compile_cuda
    RUNTIME = "runtime"              # the engine could not carry out an instruction; CUDA faults; a dead worker
    GPU_ACCESS = "gpu_access"        # a cpu_only function touched the GPU
    CORRECTNESS = "correctness"      # builtin.assert_close
    SERIALIZATION = "serialization"  # a value or path that cannot be returned
    UNAVAILABLE = "unavailable"      # a feature this server does not offer
    ENGINE = "engine"                # an exception raised by program code


class ProgramFailure(Exception):
    kind = ErrorKind.RUNTIME


class ParseFailure(ProgramFailure):
    kind = ErrorKind.PARSE


class Unavailable(ProgramFailure):
    kind = ErrorKind.UNAVAILABLE


class CorrectnessFailure(ProgramFailure):
    kind = ErrorKind.CORRECTNESS


class CompileFailure(ProgramFailure):
    kind = ErrorKind.COMPILE


class SerializationFailure(ProgramFailure):
    kind = ErrorKind.SERIALIZATION

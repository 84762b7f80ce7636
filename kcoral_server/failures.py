"""Exceptions that end a program with a specific FAILED kind (raised inside a worker)."""
from __future__ import annotations

from kcoral.protocol.error_kind import ErrorKind


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

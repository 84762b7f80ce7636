"""Find a Python crash in a stage's output: the last traceback and its exception line.

A candidate that raises (in `setup`, in its kernel call) makes the workload's test script
print the traceback on stderr and mark the regime bad; without this the crash reads as a
wrong answer and the reason is lost.
"""
from __future__ import annotations

HEADER = "Traceback (most recent call last):"


def last_traceback(text: str) -> str | None:
    """The last traceback block in `text`, through its exception line(s); None if none."""
    start = text.rfind(HEADER)
    if start < 0:
        return None
    lines = text[start:].splitlines()
    end = len(lines)
    for i, line in enumerate(lines[1:], start=1):
        if line and not line[0].isspace():
            end = i + 1   # the exception line: the first unindented line after the frames
            break
    return "\n".join(lines[:end])


def exception_line(traceback_text: str) -> str:
    """`ValueError: ...` from a traceback block (its last line)."""
    lines = [ln for ln in traceback_text.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""

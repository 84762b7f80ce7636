"""The live "still running" line that long remote commands write to stderr."""
from __future__ import annotations

import io
import time

from kcoral.progress import Ticker


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_stream_gets_periodic_lines() -> None:
    out = io.StringIO()
    with Ticker("bench of scratch/x running on http://h", stream=out, log_every_s=0.05):
        time.sleep(0.23)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2
    assert all(line.startswith("kcoral: bench of scratch/x running on http://h ... ") for line in lines)
    assert lines[-1].endswith(" s")


def test_terminal_line_is_redrawn_and_cleared() -> None:
    out = FakeTTY()
    t = Ticker("job", stream=out)
    t.period = 0.05  # a terminal normally redraws every second
    with t:
        time.sleep(0.18)
    text = out.getvalue()
    assert "\rkcoral: job ... " in text
    assert text.endswith("\r\x1b[K")  # nothing left on the line for the result
    assert "\n" not in text


def test_quick_command_prints_nothing() -> None:
    out = io.StringIO()
    with Ticker("job", stream=out, log_every_s=30):
        pass
    assert out.getvalue() == ""

"""A live "still running" line on stderr while a remote program runs.

The protocol answers a program only when it ends, so a long bench or profile would
otherwise sit silent for minutes. On a terminal the line is redrawn every second; in a
log (not a TTY) one line is written every `log_every_s` seconds.
"""
from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO


class Ticker:
    def __init__(self, label: str, stream: TextIO | None = None, log_every_s: float = 30.0) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.period = 1.0 if self.tty else log_every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kcoral-ticker", daemon=True)
        self._t0 = 0.0

    def _line(self) -> str:
        return f"kcoral: {self.label} ... {time.monotonic() - self._t0:.0f} s"

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            if self.tty:
                self.stream.write("\r" + self._line() + "\x1b[K")
            else:
                self.stream.write(self._line() + "\n")
            self.stream.flush()

    def __enter__(self) -> "Ticker":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        if self.tty:  # leave the terminal clean for the result lines
            self.stream.write("\r\x1b[K")
            self.stream.flush()

"""What `evolve evaluate` shows while stages run: on a terminal one Rich status line,
cropped to the terminal's width (a wrapped line leaves stale copies on every redraw);
otherwise one plain line per stage start and end, for logs."""
from __future__ import annotations

import time
from enum import StrEnum

from pydantic import BaseModel
from rich.console import Console
from rich.live import Live
from rich.text import Text

from evolve.safe_text import safe_text
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage


class StagePhase(StrEnum):
    STARTED = "started"
    FINISHED = "finished"


class StageEvent(BaseModel):
    candidate_id: int
    stage: Stage
    phase: StagePhase
    status: EvaluationStatus | None = None     # passed | failed, when finished
    failure_kind: FailureKind | None = None
    seconds: float | None = None
    message: str = ""                  # first line of a failure


class StageProgress:
    """A StageContext listener; use as a context manager around the stages it reports."""

    def __init__(self, console: Console):
        self.console = console
        self._live: Live | None = None
        self._current: StageEvent | None = None
        self._since = time.monotonic()

    def __enter__(self) -> StageProgress:
        if self.console.is_terminal:
            self._live = Live(self.status_text(), console=self.console, transient=True,
                              refresh_per_second=4, get_renderable=self.status_text)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def status_text(self) -> Text:
        if self._current is None:
            text = Text("evaluating ...")
        else:
            took = time.monotonic() - self._since
            text = Text(f"candidate {self._current.candidate_id}: {self._current.stage} running {took:.0f}s")
        text.truncate(max(1, self.console.width), overflow="ellipsis")
        text.no_wrap = True
        return text

    def __call__(self, event: StageEvent) -> None:
        if event.phase is StagePhase.STARTED:
            self._current, self._since = event, time.monotonic()
        line = self.finished_line(event) if event.phase is StagePhase.FINISHED else \
            f"candidate {event.candidate_id}: {event.stage} started"
        if self._live is not None:
            # Finished stages stay above the live line; starts only move the line.
            if event.phase is StagePhase.FINISHED:
                self._live.console.print(Text(line, no_wrap=True, overflow="ellipsis"))
            self._live.refresh()
        else:
            # A Text, not a str: Rich would read markup in the candidate's message.
            self.console.print(Text(line), highlight=False, soft_wrap=True)

    @staticmethod
    def finished_line(event: StageEvent) -> str:
        took = "" if event.seconds is None else f" in {event.seconds:.1f}s"
        kind = f" ({event.failure_kind})" if event.failure_kind else ""
        why = f": {safe_text(event.message)}" if event.message else ""   # the candidate's words
        return f"candidate {event.candidate_id}: {event.stage} {event.status}{kind}{took}{why}"

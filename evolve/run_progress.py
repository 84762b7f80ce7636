"""The run's progress line on the terminal: redrawn in place on a terminal, periodic lines
otherwise (a log). It only reads `RunStats`; the loop updates those."""
from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console

from evolve.leaseclock import LeaseClock
from evolve.pipeline import RunStats


class Progress:
    """One status line: redrawn in place on a terminal, periodic lines otherwise."""

    def __init__(self, stream: TextIO, gpu_slots: int, interval_s: float = 5.0, has_gpu: bool = True,
                 lease_clock: LeaseClock | None = None, console: Console | None = None):
        self.stream = stream
        # Only for the terminal's width: a redrawn line that wraps leaves a stale copy each time.
        self.console = console or Console(file=stream)
        self.lease_clock = lease_clock
        self.gpu_busy: float | None = None   # the latest lease-held fraction the server reported
        self.has_gpu = has_gpu
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.gpu_slots = gpu_slots
        self.interval_s = interval_s if not self.tty else 0.5
        self._last = 0.0

    def line(self, stats: RunStats, width: int | None = None) -> str:
        """The full line, or (given `width`) the most of it that fits: short labels first,
        then the least useful fields dropped, then an ellipsis."""
        parts = self._parts(stats)
        full = "  ".join(f"{label} {value}".strip() for label, _brief, _short, value, _keep in parts)
        if width is None or len(full) <= width:
            return full
        kept = [(keep, f"{brief} {short}".strip()) for _label, brief, short, _value, keep in parts]
        while True:
            text = " ".join(t for _, t in kept)
            if len(text) <= width or len(kept) <= 1:
                break
            kept.remove(max(kept, key=lambda item: item[0]))   # the least useful field goes first
        return text if len(text) <= width else text[: max(0, width - 1)] + "…"

    def _parts(self, stats: RunStats) -> list[tuple[str, str, str, str, int]]:
        """(label, short label, short value, value, rank): rank 0 is dropped last."""
        wall = time.monotonic() - stats.started_at
        busy = self.gpu_busy
        if busy is None:   # a server that does not report lease time: finished stages only
            busy = stats.lease_held_ms / (wall * 1000.0 * self.gpu_slots) if wall > 0 else 0.0
        fails = " ".join(f"{k}={v}" for k, v in sorted(stats.failures.items())) or "none"
        total = sum(stats.failures.values())
        top = max(stats.failures.items(), key=lambda kv: kv[1], default=None)
        short_fails = f"{total}" + (f" ({top[0][:4]} {top[1]})" if top and len(stats.failures) > 1 else
                                    f" {top[0][:4]}" if top else "")
        # The confirmed best; before any promotion, the fastest bench so far, marked as such.
        if stats.best_speedup is not None:
            best = _figure(stats.best_ms, stats.best_speedup)
            short_best = f"{stats.best_speedup:.3f}x"
        elif stats.fastest_speedup is not None:
            best = _figure(stats.fastest_ms, stats.fastest_speedup) + " unconfirmed"
            short_best = f"{stats.fastest_speedup:.3f}x?"
        else:
            best = short_best = "-"
        m, s = divmod(int(wall), 60)
        gpu = f"{busy:.0%}" if self.has_gpu else "- (CPU server)"
        return [(f"[evolve {m:02d}:{s:02d}]", f"[{m:02d}:{s:02d}]", "", "", 0),
                ("evaluated", "ev", str(stats.evaluated), str(stats.evaluated), 1),
                ("benched", "bn", str(stats.benched), str(stats.benched), 4),
                ("in flight", "run", str(stats.in_flight), str(stats.in_flight), 6),
                ("failures", "fail", short_fails, fails, 5),
                ("best", "best", short_best, best, 2),
                ("promotions", "prom", str(stats.promotions), str(stats.promotions), 7),
                ("gpu busy", "gpu", gpu if self.has_gpu else "cpu", gpu, 3)]

    def update(self, stats: RunStats, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        if self.lease_clock is not None and self.has_gpu:
            self.gpu_busy = self.lease_clock.sample()
        text = self.line(stats, width=self.console.width - 1 if self.tty else None)
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, stats: RunStats, sample: bool = True) -> None:
        """The last line; `sample=False` keeps the last GPU-busy figure (no server call,
        for an interrupted run whose user is waiting)."""
        if not sample:
            self.lease_clock = None
        self.update(stats, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _figure(ms: float | None, speedup: float) -> str:
    return f"{ms:.4f} ms {speedup:.3f}x" if ms else f"{speedup:.3f}x"

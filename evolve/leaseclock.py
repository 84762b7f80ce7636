"""How busy the server's GPUs were during a run, from the lease time its /health reports.

The evaluations' own `lease_held_ms` arrive only when a stage ends, so a figure built from
them lags while a long stage runs and leaves out other clients of a shared server. The
server's counter includes the lease held right now; a restarted server starts its counter
again from zero, which `LeaseClock` notices by the new instance id."""
from __future__ import annotations

import time
from typing import Any, Callable


class LeaseClock:
    """Seconds of GPU lease the server granted since `start()`, summed over its GPUs."""

    def __init__(self, health: Callable[[], dict[str, Any]]) -> None:
        self._health = health
        self._instance: str | None = None
        self._base = 0.0          # this instance's counter when we first saw it
        self._last = 0.0          # its counter at the latest sample
        self._earlier = 0.0       # lease seconds of instances seen before this one
        self.gpu_count = 0
        self.started_at = time.monotonic()
        self.supported = True     # False: the server does not report lease time

    def start(self, health: dict[str, Any] | None = None) -> None:
        self.started_at = time.monotonic()
        self._observe(health if health is not None else self._health(), first=True)

    def _observe(self, health: dict[str, Any], first: bool = False) -> None:
        gpus = health.get("gpus") or []
        if any("lease_held_s" not in g for g in gpus):
            self.supported = False
            return
        held = sum(float(g["lease_held_s"]) for g in gpus)
        self.gpu_count = len(gpus)
        instance = health.get("instance_id")
        if instance != self._instance:
            if self._instance is not None:
                self._earlier += self._last - self._base
            # A server we meet at the start may have leased before this run; one that
            # appears later (a restart) was started during it.
            self._base = held if first else 0.0
            self._instance = instance
        self._last = held

    def sample(self) -> float | None:
        """The lease-held fraction of wall time per GPU since start(), or None if unknown."""
        if not self.supported:
            return None
        try:
            self._observe(self._health())
        except Exception:   # a server restarting right now: keep the last figure
            pass
        return self.fraction()

    def fraction(self) -> float | None:
        wall = time.monotonic() - self.started_at
        if not self.supported or self.gpu_count == 0 or wall <= 0:
            return None
        held = self._earlier + self._last - self._base
        return max(0.0, min(1.0, held / (wall * self.gpu_count)))

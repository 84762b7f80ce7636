"""How busy the server's GPUs were during a run, from the lease time its /health reports.

The evaluations' own `lease_held_ms` arrive only when a stage ends, so a figure built from
them lags while a long stage runs and leaves out other clients of a shared server. The
server's counter includes the lease held right now; a restarted server starts its counter
again from zero, which `LeaseClock` notices by the new instance id (or by a counter that
went back). Samples are at most one per `min_interval_s`, each one short attempt, so a
server that does not answer costs the run loop little."""
from __future__ import annotations

import time
from typing import Any, Callable

_UNSEEN = object()   # no instance observed yet (an instance id may itself be missing)


class LeaseClock:
    """Seconds of GPU lease the server granted since `start()`, summed over its GPUs."""

    def __init__(self, health: Callable[[], dict[str, Any]], min_interval_s: float = 5.0) -> None:
        self._health = health
        self.min_interval_s = min_interval_s
        self._sampled_at = float("-inf")
        self._instance: object = _UNSEEN
        self._base = 0.0          # this instance's counter when we first saw it
        self._last = 0.0          # its counter at the latest sample
        self._earlier = 0.0       # lease seconds of instances seen before this one
        self.gpu_count = 0
        self.started_at = time.monotonic()
        self.supported = True     # False: the server does not report lease time

    def start(self, health: dict[str, Any] | None = None) -> None:
        self.started_at = time.monotonic()
        self._observe(health if health is not None else self._health())

    def _observe(self, health: dict[str, Any]) -> None:
        gpus = health.get("gpus") or []
        if any("lease_held_s" not in g for g in gpus):
            self.supported = False
            return
        held = sum(float(g["lease_held_s"]) for g in gpus)
        self.gpu_count = len(gpus)
        instance = health.get("instance_id")
        if self._instance is _UNSEEN:
            self._base = held          # what the server leased before this run is not ours
        elif instance != self._instance or held < self._last:
            # A restarted server (a new instance, or a counter that went back) counts from
            # zero; what the one before it counted stays.
            self._earlier += self._last - self._base
            self._base = 0.0
        self._instance = instance
        self._last = held

    def sample(self) -> float | None:
        """The lease-held fraction of wall time per GPU since start(), or None if unknown."""
        if not self.supported:
            return None
        now = time.monotonic()
        if now - self._sampled_at >= self.min_interval_s:
            self._sampled_at = now
            try:
                self._observe(self._health())
            except Exception:  # noqa: BLE001 - `health` is any callable: a failed sample (a server restarting right now) keeps the last figure, never stops the run loop
                pass
        return self.fraction()

    def fraction(self) -> float | None:
        wall = time.monotonic() - self.started_at
        if not self.supported or self.gpu_count == 0 or wall <= 0:
            return None
        held = self._earlier + self._last - self._base
        return max(0.0, min(1.0, held / (wall * self.gpu_count)))

"""What every stage needs: the client, the population, the run, the stage settings, and
the gate that keeps GPU stages within the server's capacity."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from kcoral import Client, KcoralError

from evolve.config import StageConfig
from evolve.digest import SourcesChanged
from evolve.families import Family, ParamsError
from evolve.population import Candidate, Population
from evolve.render import RenderError, render_candidate

log = logging.getLogger(__name__)


class GpuGate:
    """At most `slots` GPU stages at once; waits while the server's queue is long."""

    def __init__(self, client: Client, slots: int, max_queue: int, poll_s: float = 0.5):
        self.client = client
        self.slots = max(1, slots)
        self.max_queue = max_queue
        self.poll_s = poll_s
        self._sem = threading.BoundedSemaphore(self.slots)
        self._lock = threading.Lock()
        self._queue_seen = 0
        self._checked_at = 0.0

    @contextmanager
    def slot(self, cancel: threading.Event | None = None) -> Iterator[None]:
        with self._sem:
            self._throttle(cancel)
            yield

    def _queue_length(self) -> int:
        with self._lock:
            if time.monotonic() - self._checked_at > self.poll_s:
                try:
                    self._queue_seen = int(self.client.health().get("queue_length", 0) or 0)
                except (KcoralError, AttributeError, TypeError, ValueError):  # a restarting server, or an odd /health: the stage's own retry handles it
                    self._queue_seen = 0
                self._checked_at = time.monotonic()
            return self._queue_seen

    def _throttle(self, cancel: threading.Event | None, max_wait_s: float = 120.0) -> None:
        # Other users (agents) share the server: do not pile more work onto a long queue.
        deadline = time.monotonic() + max_wait_s
        while self._queue_length() > self.max_queue and time.monotonic() < deadline:
            if cancel is not None and cancel.wait(self.poll_s):
                return
            if cancel is None:
                time.sleep(self.poll_s)


@dataclass
class RunStats:
    """Counters for the progress line (thread-safe through `lock`)."""
    started_at: float = field(default_factory=time.monotonic)
    evaluated: int = 0
    in_flight: int = 0
    passed: int = 0
    failures: Counter = field(default_factory=Counter)
    lease_held_ms: float = 0.0
    best_ms: float | None = None   # the confirmed best (the latest promotion's bench)
    best_speedup: float | None = None
    promotions: int = 0
    # Benches passed in this run, and the fastest of them: on one GPU a pipeline (check,
    # gputest, bench, two confirmations) takes minutes, and until the first one ends these
    # are the only news of the search.
    benched: int = 0
    fastest_ms: float | None = None
    fastest_speedup: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_lease(self, ms: float | None) -> None:
        if ms:
            with self.lock:
                self.lease_held_ms += ms

    def add_bench(self, ms: float | None, speedup: float | None) -> None:
        with self.lock:
            self.benched += 1
            if speedup is not None and (self.fastest_speedup is None or speedup > self.fastest_speedup):
                self.fastest_ms, self.fastest_speedup = ms, speedup


@dataclass
class StageContext:
    client: Client
    pop: Population
    workload_id: int
    workload_dir: Path
    run_id: int | None
    stages: dict[str, StageConfig]
    families: dict[str, Family]
    gate: GpuGate
    transport_wait_s: float = 300.0
    root_dir: Path = field(default_factory=Path.cwd)
    stats: RunStats = field(default_factory=RunStats)
    cancel: threading.Event = field(default_factory=threading.Event)
    listener: Callable[[Any], None] | None = None   # gets a StageEvent at each stage start and end
    worker_id: int | None = None    # this process's lease in a run shared by several (Population.join_run)
    # The search's own pipelines may skip a bench its quick time rules out ([stages.bench]
    # skip_slower_than); a bench a person asks for (`evolve evaluate`) always runs.
    screen_benches: bool = False
    _target: dict[str, Any] | None = None
    _instance: str | None = None

    def target(self) -> dict[str, Any]:
        if self._target is None:
            health = self.client.health()
            self._target = dict(health.get("target") or {})
            self._instance = health.get("instance_id")
        return self._target

    def server_instance(self) -> str | None:
        try:
            self._instance = self.client.health().get("instance_id") or self._instance
        except (KcoralError, AttributeError):  # unreachable, or a /health answer that is no object
            pass
        return self._instance

    def candidate_dir(self, cand: Candidate) -> Path:
        p = Path(cand.directory)
        if p.is_absolute():
            return p
        for base in (Path.cwd(), self.root_dir):
            if (base / p).is_dir():
                return (base / p).resolve()
        return (self.root_dir / p).resolve()

    def restored_dir(self, cand: Candidate) -> Path:
        """`candidate_dir`, rendered again from the candidate's family and parameters where it
        is gone (a run resumed on another host, a cleaned generated folder). Rendering is
        deterministic and names its folder by digest, so the same templates restore the same
        folder. Raises SourcesChanged where the family now renders other sources (its
        templates were edited since): the recorded results are not for them."""
        path = self.candidate_dir(cand)
        family = self.families.get(cand.family) if cand.family else None
        if path.is_dir() or family is None or path.name != cand.digest:
            return path
        try:
            rendered = render_candidate(family, cand.params, path.parent)
        except (RenderError, ParamsError, OSError) as exc:
            raise SourcesChanged(f"the folder of candidate {cand.id} ({path}) is gone, and family "
                                 f"{family.name!r} cannot render its parameters again: {exc}") from None
        if rendered != path:
            raise SourcesChanged(
                f"the folder of candidate {cand.id} ({path}) is gone, and family {family.name!r} renders "
                f"other sources for its parameters now (digest {rendered.name[:12]}, not {cand.digest[:12]}): "
                f"its templates changed since, so its recorded results are not for them")
        log.info("candidate %s: its folder was gone; rendered again from family %r", cand.id, family.name)
        return path

"""One JSON line per request (and per notable server event) on stderr.

Lines are written in batches by a background thread (every 20 ms), so a slow stderr
(a file on a busy disk, a stalled pipe) never holds up the event loop, and a request does
not pay for waking a thread.
"""
from __future__ import annotations

import json
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestLog:
    """Fields of the one log line a request produces."""

    request_id: str
    client: str
    fields: dict[str, Any] = field(default_factory=dict)


_lines: "queue.SimpleQueue[str | None]" = queue.SimpleQueue()
_writer: threading.Thread | None = None
_lock = threading.Lock()


def _write_loop() -> None:
    while True:
        batch: list[str] = []
        stop = False
        while True:
            try:
                line = _lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                stop = True
                break
            batch.append(line)
        if batch:
            try:
                sys.stderr.write("".join(batch))
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # a closed stderr must never fail a request
        if stop:
            return
        time.sleep(0.02)


def _emit(record: dict[str, Any]) -> None:
    global _writer
    record = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z", **record}
    line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
    if _writer is None:
        with _lock:
            if _writer is None:
                _writer = threading.Thread(target=_write_loop, name="kcoral-log", daemon=True)
                _writer.start()
    _lines.put(line)


def flush(timeout: float = 5.0) -> None:
    """Write out every queued line (called at shutdown)."""
    global _writer
    with _lock:
        writer, _writer = _writer, None
    if writer is not None:
        _lines.put(None)
        writer.join(timeout)


def log_request(**fields: Any) -> None:
    _emit({"event": "request", **fields})


def log_event(event: str, **fields: Any) -> None:
    _emit({"event": event, **fields})

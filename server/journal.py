"""Idempotency journal: one outcome per Idempotency-Key, shared by retries.

In memory while the server runs; completed outcomes are also written under
<state-dir>/journal so that a retry after a restart gets the first outcome. Entries
expire after the retention window, and the oldest completed ones are dropped early when
the stored bodies exceed a byte budget (so memory stays bounded; a retry of a dropped
key runs the program again).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import dataclass, field


@dataclass
class StoredResponse:
    status_code: int
    headers: dict[str, str]
    body: bytes


@dataclass
class JournalEntry:
    program_hash: str
    created: float
    response: StoredResponse | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Journal:
    def __init__(self, state_dir: str | None, retention_seconds: float, max_bytes: int = 1 << 30) -> None:
        self.retention = retention_seconds
        self.max_bytes = max_bytes
        self._bytes = 0  # sum of the stored response bodies
        self._entries: dict[str, JournalEntry] = {}
        self._dir = os.path.join(state_dir, "journal") if state_dir else None
        if self._dir:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
            self._load()

    # ------------------------------------------------------------------ persistence
    def _file(self, key: str) -> str:
        assert self._dir is not None
        return os.path.join(self._dir, hashlib.sha256(key.encode()).hexdigest())

    def _load(self) -> None:
        assert self._dir is not None
        now = time.time()
        for name in os.listdir(self._dir):
            if not name.endswith(".json"):
                continue
            meta_path = os.path.join(self._dir, name)
            body_path = meta_path[:-5] + ".body"
            try:
                with open(meta_path) as f:
                    meta = json.load(f)
                if now - meta["created"] > self.retention:
                    raise ValueError("expired")
                with open(body_path, "rb") as f:
                    body = f.read()
            except (OSError, ValueError, KeyError):
                for p in (meta_path, body_path):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
                continue
            entry = JournalEntry(meta["program_hash"], meta["created"],
                                 StoredResponse(meta["status_code"], meta["headers"], body))
            entry.done.set()
            self._entries[meta["key"]] = entry
            self._bytes += len(body)
        self._evict()

    def _persist(self, key: str, entry: JournalEntry) -> None:
        assert self._dir is not None and entry.response is not None
        base = self._file(key)
        for suffix, data in ((".body", entry.response.body), (".json", json.dumps({
            "key": key, "program_hash": entry.program_hash, "created": entry.created,
            "status_code": entry.response.status_code, "headers": entry.response.headers,
        }).encode())):
            tmp = base + suffix + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, base + suffix)

    # ------------------------------------------------------------------ API
    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        if entry.response is not None:
            self._bytes -= len(entry.response.body)
        if self._dir:
            for suffix in (".json", ".body"):
                try:
                    os.unlink(self._file(key) + suffix)
                except OSError:
                    pass

    def _evict(self, keep: str | None = None) -> None:
        """Drop the oldest completed outcomes (never `keep`) until under the byte budget."""
        if self._bytes <= self.max_bytes:
            return
        done = sorted((e.created, k) for k, e in self._entries.items() if e.response is not None and k != keep)
        for _, key in done:
            if self._bytes <= self.max_bytes:
                break
            self._drop(key)

    @property
    def stored_bytes(self) -> int:
        return self._bytes

    def prune(self) -> None:
        cutoff = time.time() - self.retention
        for key, entry in list(self._entries.items()):
            if entry.response is not None and entry.created < cutoff:
                self._drop(key)

    def get(self, key: str) -> JournalEntry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.response is not None and time.time() - entry.created > self.retention:
            self.prune()
            return None
        return entry

    def begin(self, key: str, program_hash: str) -> JournalEntry:
        entry = JournalEntry(program_hash, time.time())
        self._entries[key] = entry
        return entry

    async def finish(self, key: str, response: StoredResponse) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.response = response
        self._bytes += len(response.body)
        entry.done.set()
        self._evict(keep=key)
        if self._dir and key in self._entries:
            await asyncio.to_thread(self._persist, key, entry)

    def abandon(self, key: str) -> None:
        """The program never ran (busy, draining): forget the key, wake waiters to retry."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.done.set()

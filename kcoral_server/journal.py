"""Idempotency journal: one outcome per Idempotency-Key, shared by retries.

In memory while the server runs; completed outcomes are also written under
<state-dir>/journal so that a retry after a restart gets the first outcome. Each stored
entry is HMAC-signed with a key kept in <state-dir>/journal.key (0600, outside every
sandbox); an entry whose signature does not verify is dropped at load, so a forged or
edited file is never replayed to a client. Entries
expire after the retention window, and the oldest completed ones are dropped early when
the stored bodies exceed a byte budget (so memory stays bounded; a retry of a dropped
key runs the program again).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field


KEY_FILE_NAME = "journal.key"


def _load_key(path: str) -> bytes:
    """The journal's signing key: read, or generated (0600) on first use."""
    try:
        with open(path, "rb") as f:
            key = f.read()
        if len(key) >= 32:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    os.replace(tmp, path)
    return key


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
    # Set when a retry waits for this entry: a first attempt whose client disconnected then
    # finishes for the retry instead of being cancelled.
    wanted: asyncio.Event = field(default_factory=asyncio.Event)


class Journal:
    def __init__(self, state_dir: str | None, retention_seconds: float, max_bytes: int = 1 << 30) -> None:
        self.retention = retention_seconds
        self.max_bytes = max_bytes
        self._bytes = 0  # sum of the stored response bodies
        self._entries: dict[str, JournalEntry] = {}
        self._dir = os.path.join(state_dir, "journal") if state_dir else None
        self._key = b""
        if state_dir and self._dir:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
            self._key = _load_key(os.path.join(state_dir, KEY_FILE_NAME))
            self._load()

    # ------------------------------------------------------------------ persistence
    def _file(self, key: str) -> str:
        assert self._dir is not None
        return os.path.join(self._dir, hashlib.sha256(key.encode()).hexdigest())

    def _mac(self, meta: dict[str, object], body: bytes) -> str:
        signed = {k: v for k, v in meta.items() if k != "mac"}
        text = json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(self._key, text + b"\0" + hashlib.sha256(body).digest(), hashlib.sha256).hexdigest()

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
                if not hmac.compare_digest(str(meta.get("mac", "")), self._mac(meta, body)):
                    raise ValueError("bad signature")
                if os.path.basename(self._file(meta["key"])) != name[:-5]:
                    raise ValueError("entry filed under another key")
            except (OSError, ValueError, KeyError, TypeError):
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
        meta: dict[str, object] = {
            "key": key, "program_hash": entry.program_hash, "created": entry.created,
            "status_code": entry.response.status_code, "headers": entry.response.headers,
        }
        meta["mac"] = self._mac(meta, entry.response.body)
        for suffix, data in ((".body", entry.response.body), (".json", json.dumps(meta).encode())):
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

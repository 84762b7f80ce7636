"""Stage logs as stored: bounded (head and tail kept) and zlib-compressed.

A stage's output can be megabytes (a crashing kernel printing per element); the head
says how it started and the tail how it ended, so the middle is what is dropped.
"""
from __future__ import annotations

import zlib

MAX_STREAM_CHARS = 256 * 1024      # per stream, before compression
_HEAD_SHARE = 4                    # a quarter head, the rest tail


def bound(text: str, limit: int = MAX_STREAM_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = limit // _HEAD_SHARE
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters left out ...]\n{text[-tail:]}"


def pack(text: str | None) -> bytes | None:
    """The stored form of one stream; None for nothing to store."""
    if not text:
        return None
    return zlib.compress(bound(text).encode("utf-8", "replace"), 6)


def unpack(blob: bytes | None) -> str:
    if not blob:
        return ""
    return zlib.decompress(blob).decode("utf-8", "replace")

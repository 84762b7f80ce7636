"""The circuit breaker of an unattended run: N failures in a row with the same kind and
message mean the setup is broken (a missing package, a dead tool), not the candidates, so
the run stops instead of spending its whole budget failing."""
from __future__ import annotations

import re

# Paths (per-request work folders) and addresses differ between candidates failing for one
# cause; plain numbers are kept: "chunk 48 does not divide T" and "chunk 32 ..." are two
# points of a search failing honestly, not one broken setup.
_VOLATILE = re.compile(r"0x[0-9a-f]+|/[^\s:'\"]+", re.IGNORECASE)


def failure_signature(kind: str, message: str) -> tuple[str, str]:
    """(kind, first message line with paths and addresses blanked): one cause, one signature."""
    first = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    return kind, _VOLATILE.sub("#", first)[:300]


class FailureBreaker:
    """Trips after `limit` consecutive failures with one signature (0: never trips)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._signature: tuple[str, str] | None = None
        self._count = 0
        self._message = ""

    def record_success(self) -> None:
        self._signature, self._count = None, 0

    def record_failure(self, kind: str, message: str) -> str | None:
        """Why the run must stop now, or None."""
        signature = failure_signature(kind, message)
        if signature == self._signature:
            self._count += 1
        else:
            self._signature, self._count = signature, 1
        self._message = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
        if self.limit and self._count >= self.limit:
            return f"{self._count} consecutive failures of the same kind: {kind}: {self._message[:300]}"
        return None

"""The holdout salt and the seeds derived from it. Lives only in the server process."""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from .reqlog import log_event

SALT_FILE_NAME = "holdout_salt"


class HoldoutSalt:
    def __init__(self, salt: bytes) -> None:
        if not salt:
            raise ValueError("the holdout salt is empty")
        self._salt = salt

    def __repr__(self) -> str:  # never print the salt
        return "HoldoutSalt(<hidden>)"

    @classmethod
    def load(cls, salt_file: str | None, state_dir: str | None) -> "HoldoutSalt":
        """From --holdout-salt-file; else from (or generated into) --state-dir; else ephemeral.

        The key is the file's bytes without a trailing newline.
        """
        if salt_file:
            with open(salt_file, "rb") as f:
                return cls(f.read().rstrip(b"\r\n"))
        if state_dir:
            path = os.path.join(state_dir, SALT_FILE_NAME)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    return cls(f.read().rstrip(b"\r\n"))
            salt = secrets.token_hex(32).encode()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(salt + b"\n")
            log_event("holdout_salt_generated", stored_in_state_dir=True)
            return cls(salt)
        log_event("holdout_salt_generated", stored_in_state_dir=False,
                  note="ephemeral: holdout seeds change when the server restarts")
        return cls(secrets.token_hex(32).encode())

    def seeds(self, namespace: str, count: int) -> list[int]:
        """Fresh seeds for one run: HMAC of the salt over the namespace and a nonce drawn
        now. No program can ask for the seeds of another run (its nonce is never given
        out), and a run's seeds, leaked, say nothing of the next run's. The nonce goes to
        the server's log only, so that whoever holds the salt can replay a holdout."""
        nonce = secrets.token_hex(16)
        log_event("holdout_seeds", namespace=namespace, count=count, nonce=nonce)
        return [self.derive(namespace, nonce, i) for i in range(count)]

    def derive(self, namespace: str, nonce: str, i: int) -> int:
        digest = hmac.new(self._salt, f"{namespace}:{nonce}:{i}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big")

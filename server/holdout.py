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
        out = []
        for i in range(count):
            digest = hmac.new(self._salt, f"{namespace}:{i}".encode(), hashlib.sha256).digest()
            out.append(int.from_bytes(digest[:8], "big"))
        return out

"""Bearer-token check."""
from __future__ import annotations

import hmac


class BearerAuth:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def allows(self, authorization: str | None) -> bool:
        if self._token is None:
            return True
        if not authorization or not authorization.startswith("Bearer "):
            return False
        return hmac.compare_digest(authorization[7:].strip().encode(), self._token)

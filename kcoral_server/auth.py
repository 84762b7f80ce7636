"""Bearer-token check, and the rule for tokens that guard a public bind."""
from __future__ import annotations

import hmac

# A token that guards a non-loopback bind must resist guessing over the network.
MIN_PUBLIC_TOKEN_CHARS = 16
_SCHEME = "bearer"


def public_token_problem(token: str | None) -> str | None:
    """Why `token` cannot guard a non-loopback bind, or None when it can."""
    if not token:
        return "refusing to bind a non-loopback address without a token (--token-file or KCORAL_SERVER_TOKEN)"
    if len(token) < MIN_PUBLIC_TOKEN_CHARS:
        return (f"refusing to bind a non-loopback address with a {len(token)}-character token: "
                f"it must have at least {MIN_PUBLIC_TOKEN_CHARS} characters")
    return None


class BearerAuth:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    def allows(self, authorization: str | None) -> bool:
        if self._token is None:
            return True
        # RFC 7235: the auth scheme is case-insensitive ("bearer", "BEARER" are the same).
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != _SCHEME:
            return False
        return hmac.compare_digest(credentials.strip().encode(), self._token)

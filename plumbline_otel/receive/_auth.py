"""The bearer-token rule both transports share."""

from __future__ import annotations

import hmac


def bearer_ok(header: str | None, token: bytes) -> bool:
    """Whether an `Authorization` value carries `token`: the scheme is case-insensitive (RFC 9110 §11.1), the token is not."""
    scheme, _, given = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)

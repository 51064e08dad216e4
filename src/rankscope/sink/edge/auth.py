"""Who may talk to the sink: one bearer token, checked the same way by both transports.

``Authorization: Bearer <token>`` (the scheme in any case), compared in constant time. The
gRPC transport reads it from the call's metadata, the HTTP one from the header; both answer a
missing or wrong token with ``UNAUTHORIZED`` before they read anything else.
"""

from __future__ import annotations

import hmac

UNAUTHORIZED = "missing or wrong bearer token"


def authorized(expected: str | None, header: str | None) -> bool:
    """Whether ``header`` carries the sink's token (``expected``; None: the sink takes anyone)."""
    if expected is None:
        return True
    scheme, _, token = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode())

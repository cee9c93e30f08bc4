"""Who may call the dashboard, and which POSTs it accepts.

- Bound to a loopback address, the server answers only requests addressed
  to a loopback name (``Host``), so a page elsewhere that re-points its DNS
  name at 127.0.0.1 reads nothing.
- With a token (``DAGWERK_UI_TOKEN``; required off loopback) every request
  but ``/healthz``, ``/login`` and ``/static`` carries it as
  ``Authorization: Bearer TOKEN`` or holds the HTTP-only session cookie the
  login page sets (a keyed hash of the token, never the token).
- Form POSTs carry the CSRF token of the ``dagwerk_csrf`` cookie in their
  ``csrf`` field (double submit). JSON POSTs must say
  ``Content-Type: application/json``, which no cross-site page can send
  without a CORS preflight this server never grants, and a present
  ``Origin`` must be this server's.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

from dagwerk.errors import DagwerkError

__all__ = [
    "CSRF_COOKIE",
    "SESSION_COOKIE",
    "TOKEN_ENV",
    "Caller",
    "UnsafeBindError",
    "check_bind",
    "is_loopback",
    "new_csrf_token",
    "session_value",
    "tokens_match",
]

TOKEN_ENV = "DAGWERK_UI_TOKEN"
SESSION_COOKIE = "dagwerk_session"
CSRF_COOKIE = "dagwerk_csrf"
MIN_TOKEN_LENGTH = 16
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class UnsafeBindError(DagwerkError, ValueError):
    """The server would listen beyond loopback without a token, or the token is weak."""

    code = "ui_token_required"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve ``host`` beyond loopback without a token, and any
    token shorter than :data:`MIN_TOKEN_LENGTH` characters."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise UnsafeBindError(
            f"{TOKEN_ENV} must be at least {MIN_TOKEN_LENGTH} characters",
            field=TOKEN_ENV,
            limit=MIN_TOKEN_LENGTH,
        )
    if token is None and not is_loopback(host):
        raise UnsafeBindError(
            f"--host {host} listens beyond loopback: set {TOKEN_ENV} to a secret "
            "(at least 16 characters) that every caller must present",
            field="host",
        )


def session_value(token: str) -> str:
    """The session cookie's value for ``token``: a keyed hash, so the cookie
    never holds the token itself."""
    return hmac.new(token.encode(), b"dagwerk-ui-session", hashlib.sha256).hexdigest()


def tokens_match(given: str | None, expected: str) -> bool:
    """Constant-time comparison; ``None`` never matches."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def new_csrf_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request, for the action log: the client address and how
    it was let in (``bearer``, ``session`` or ``loopback`` without a token)."""

    address: str
    via: str

    def __str__(self) -> str:
        return f"{self.address} ({self.via})"

"""Authentication, CSRF protection and security headers for the dashboard.

* API clients send ``Authorization: Bearer <token>``. A bearer token is not an ambient
  credential (a browser never adds it by itself), so such requests need no CSRF token.
* Browsers log in once with the token and get a signed session cookie (HttpOnly,
  SameSite=Strict). Every mutation made with that cookie, or without any credential in
  insecure mode, must carry a CSRF token (form field ``csrf_token`` or header
  ``X-CSRF-Token``) and, when the browser sends one, an ``Origin`` naming this host.
* The CSRF token is an HMAC of a random per-browser cookie, so a page on another site can
  neither read nor forge it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

from durq.errors import DurqError

SESSION_COOKIE = "durq_session"
CSRF_COOKIE = "durq_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: Sent with every response. No inline script, no inline style, nothing from elsewhere.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class CSRFError(DurqError):
    """The CSRF check failed: the form expired or came from another site."""


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of two texts of any characters.

    ``hmac.compare_digest`` raises ``TypeError`` for non-ASCII ``str``; a hostile cookie or
    header must be a wrong credential, never a crash."""
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def generate_token() -> str:
    """A new random access token (printed by ``durq dash`` when none is given)."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Auth:
    """Checks credentials; one per dashboard app.

    ``token=None`` means insecure mode: every request is let in (CSRF still applies)."""

    token: str | None
    key: bytes
    session_seconds: float = 12 * 3600

    @classmethod
    def create(cls, token: str | None, secret_key: str | bytes | None = None) -> Auth:
        """Sessions are signed with ``secret_key``, else with a key derived from the token
        (so several processes with the same token accept each other's cookies), else with a
        random key (insecure mode)."""
        if isinstance(secret_key, str):
            key = secret_key.encode()
        elif secret_key is not None:
            key = secret_key
        elif token is not None:
            key = hashlib.sha256(b"durq-dashboard-session:" + token.encode()).digest()
        else:
            key = secrets.token_bytes(32)
        return cls(token=token, key=key)

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def check_token(self, candidate: str | None) -> bool:
        if self.token is None or not candidate:
            return False
        return same_secret(candidate, self.token)

    def bearer(self, request: Request) -> bool:
        """``True`` when the request carries the right bearer token."""
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and self.check_token(value.strip())

    def _sign(self, message: str) -> str:
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()

    def new_session(self, now: float) -> str:
        """A session cookie value valid for ``session_seconds``."""
        expires = int(now + self.session_seconds)
        return f"{expires}.{self._sign(f'session:{expires}')}"

    def session(self, request: Request, now: float) -> bool:
        """``True`` when the request carries a valid, unexpired session cookie."""
        value = request.cookies.get(SESSION_COOKIE, "")
        expires, _, sig = value.partition(".")
        if not (expires.isascii() and expires.isdigit()) or not sig:
            return False
        if not same_secret(sig, self._sign(f"session:{expires}")):
            return False
        return int(expires) > now

    def csrf_token(self, csrf_cookie: str) -> str:
        """The token forms must echo for this browser's CSRF cookie."""
        return self._sign(f"csrf:{csrf_cookie}")[:40]

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        """The submitted token matches this browser's cookie and the origin is ours."""
        cookie = request.cookies.get(CSRF_COOKIE)
        if not cookie or not submitted:
            return False
        if not same_secret(submitted, self.csrf_token(cookie)):
            return False
        return same_origin(request)


def same_origin(request: Request) -> bool:
    """``False`` when the browser says the request comes from another site."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        # Browsers send Origin on every cross-site POST; "null" is an opaque (hostile) origin.
        return origin is None and request.headers.get("sec-fetch-site") in (
            None,
            "same-origin",
            "none",
        )
    host = request.headers.get("host", "")
    return urlsplit(origin).netloc.lower() == host.lower()


def new_csrf_cookie() -> str:
    return secrets.token_urlsafe(18)

"""Authentication, CSRF protection and security headers for the dashboard.

* API clients send ``Authorization: Bearer <token>``. A bearer token is not an ambient
  credential (a browser never adds it by itself), so such requests need no CSRF token.
* Browsers log in once with the token and get a signed session cookie (HttpOnly,
  SameSite=Strict). Every mutation made with that cookie, or without any credential in
  insecure mode, must carry a CSRF token (form field ``csrf_token`` or header
  ``X-CSRF-Token``) and, when the browser sends one, an ``Origin`` naming this host.
* The CSRF token is an HMAC, with the server's key, of the session id: it is worth nothing
  with another session's cookie, and a page on another site can neither read nor forge it.
  Before a session exists (the login form, insecure mode) it is an HMAC of a random
  per-browser cookie instead; such a token is never accepted with a session.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
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
    session_seconds: float = 3600
    #: Session ids logged out before they expire (id -> expiry), this process.
    revoked: dict[str, float] = field(default_factory=dict, compare=False)

    @classmethod
    def create(
        cls,
        token: str | None,
        secret_key: str | bytes | None = None,
        session_seconds: float = 3600,
    ) -> Auth:
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
        return cls(token=token, key=key, session_seconds=session_seconds)

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
        """A session cookie value valid for ``session_seconds``: expiry, a random session
        id (so one session can be revoked) and the signature of both."""
        expires = int(now + self.session_seconds)
        sid = secrets.token_urlsafe(12)
        return f"{expires}.{sid}.{self._sign(f'session:{expires}:{sid}')}"

    def _valid_session(self, value: str, now: float) -> tuple[str, int] | None:
        expires, _, rest = value.partition(".")
        sid, _, sig = rest.partition(".")
        if not (expires.isascii() and expires.isdigit() and len(expires) < 16) or not sig:
            return None
        if not same_secret(sig, self._sign(f"session:{expires}:{sid}")):
            return None
        if int(expires) <= now or sid in self.revoked:
            return None
        return sid, int(expires)

    def session_id(self, request: Request, now: float) -> str | None:
        """The id of the request's session if it is valid, unexpired and not revoked."""
        found = self._valid_session(request.cookies.get(SESSION_COOKIE, ""), now)
        return found[0] if found is not None else None

    def session(self, request: Request, now: float) -> bool:
        """``True`` when the request carries a valid, unexpired, not revoked session."""
        return self.session_id(request, now) is not None

    def revoke(self, request: Request, now: float) -> None:
        """Log the request's session out: its cookie is refused from now on, even if a copy
        of it was kept. (Several dashboard processes: change ``secret_key`` to end every
        session at once.)"""
        found = self._valid_session(request.cookies.get(SESSION_COOKIE, ""), now)
        for sid, expires in list(self.revoked.items()):
            if expires <= now:
                del self.revoked[sid]  # expired anyway: no need to remember it
        if found is not None:
            self.revoked[found[0]] = found[1]

    def sign_notice(self, text: str) -> str:
        """The signature that marks a notice as issued by this server."""
        return self._sign(f"notice:{text}")[:32]

    def notice_ok(self, text: str, signature: str) -> bool:
        return same_secret(signature, self.sign_notice(text))

    def csrf_token(self, session_id: str | None, csrf_cookie: str) -> str:
        """The token forms must echo: bound to the session when there is one, else to the
        browser's pre-session CSRF cookie (distinct prefixes: neither stands for the other)."""
        if session_id is not None:
            return self._sign(f"csrf-session:{session_id}")[:40]
        return self._sign(f"csrf-browser:{csrf_cookie}")[:40]


def csrf_ok(request: Request, submitted: str | None, *, login: bool = False) -> bool:
    """The submitted token is the one the guard expects for this request (``durq_csrf``
    in the request's state: the session's, or before login the browser cookie's) and the
    origin is ours.

    ``login``: the login form also accepts the pre-session token (a tab opened before
    another tab logged in); that token only lets one try the access token."""
    state = request.scope.get("state", {})
    accepted = [state.get("durq_csrf")]
    if login:
        accepted.append(state.get("durq_csrf_login"))
    if not submitted or not any(token and same_secret(submitted, token) for token in accepted):
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


def client_of(scope: Mapping[str, Any]) -> str:
    """The client's address (as the server saw it, or as a trusted proxy reported it)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def host_allowed(host_header: str, server: tuple[str, int] | None, allowed: Iterable[str]) -> bool:
    """Whether the ``Host`` header names this server, the defence against DNS rebinding (a
    page of another site that resolves its own name to this address).

    Accepted: the address the server is bound to, any IP address (a rebinding attack needs a
    name), ``localhost``, and the names in ``allowed`` (``.example.com`` for a domain and
    its subdomains, ``*`` for any host)."""
    allowed = list(allowed)
    if "*" in allowed:
        return True
    try:
        parts = urlsplit(f"//{host_header}")
        name = (parts.hostname or "").rstrip(".")
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:
        return False
    if not name or not host_header.isascii():
        return False
    if server is not None and name == str(server[0]).lower():
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    if name == "localhost":
        return True
    for entry in allowed:
        entry = entry.lower()
        if name == entry or (entry.startswith(".") and (name.endswith(entry) or name == entry[1:])):
            return True
    return False


class FailureLimiter:
    """Counts failed authentications per client; after ``limit`` failures within ``window``
    seconds the client is refused (429) until the oldest failure leaves the window.
    Bounded: at most ``max_clients`` are remembered (the oldest forgotten first)."""

    def __init__(self, limit: int = 10, window: float = 60.0, max_clients: int = 10_000) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        self._failures: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict()
        )

    def _recent(self, client: str, now: float) -> collections.deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times

    def retry_after(self, client: str, now: float) -> float | None:
        """Seconds until ``client`` may try again, or ``None`` when it may now."""
        times = self._recent(client, now)
        if times is None or len(times) < self.limit:
            return None
        return max(1.0, times[0] + self.window - now)

    def failed(self, client: str, now: float) -> None:
        """Record one failed authentication of ``client``."""
        times = self._recent(client, now)
        if times is None:
            times = self._failures[client] = collections.deque(maxlen=self.limit)
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)
        times.append(now)

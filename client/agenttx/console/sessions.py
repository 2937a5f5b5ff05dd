"""Sign-in sessions of the console, kept in this process's memory.

Why server-side: the bearer token a person signs in with is their credential at the
service; it must never reach the browser's storage or JavaScript. The browser holds only
an opaque, random session id in an HttpOnly, SameSite=Strict cookie (Secure when the
console serves TLS); the token stays here, inside the one `AsyncClient` the session owns,
which forwards it on every gRPC call. Signing out or expiring closes that client.

Every session, signed in or not, carries its own CSRF token: the sign-in form is a form
like any other. Signing in replaces the session id (a session fixed before sign-in is
worthless after it).

What it must never do: log, print or render a token; keep a session past its idle or
absolute lifetime; grow without bound (the oldest sessions are evicted past `max_sessions`).
Sessions do not survive a restart of the console: people sign in again.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field

from ..client import AsyncClient

log = logging.getLogger(__name__)

COOKIE = "agenttx_console"
DEFAULT_IDLE_S = 1800.0        # signed out after 30 minutes without a request
DEFAULT_LIFETIME_S = 43200.0   # and after 12 hours whatever happens
DEFAULT_MAX_SESSIONS = 10000
_SWEEP_EVERY_S = 30.0


@dataclass
class Session:
    id: str
    csrf: str
    created: float
    seen: float
    client: AsyncClient | None = None   # set once signed in; holds the token
    principal: str = ""
    admin: bool = False
    authenticated: bool = True           # False: the service runs without authentication
    flash: list[tuple[str, str]] = field(default_factory=list)  # (kind, text), shown once

    @property
    def signed_in(self) -> bool:
        return self.client is not None

    @property
    def who(self) -> str:
        """The signed-in person as the service knows them."""
        if not self.authenticated:
            return "anonymous (the service runs without authentication)"
        return self.principal + (" (admin)" if self.admin else "")

    def check_csrf(self, token: object) -> bool:
        return isinstance(token, str) and hmac.compare_digest(token.encode(),
                                                              self.csrf.encode())

    def say(self, kind: str, text: str) -> None:
        """A message for the next page this session sees (after a redirect)."""
        self.flash.append((kind, text))

    def take_flash(self) -> list[tuple[str, str]]:
        out, self.flash = self.flash, []
        return out


class Sessions:
    def __init__(self, *, idle_s: float = DEFAULT_IDLE_S,
                 lifetime_s: float = DEFAULT_LIFETIME_S,
                 max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.idle_s = idle_s
        self.lifetime_s = lifetime_s
        self.max_sessions = max_sessions
        self._by_id: dict[str, Session] = {}
        self._swept = time.monotonic()

    def __len__(self) -> int:
        return len(self._by_id)

    def _expired(self, s: Session, now: float) -> bool:
        return now - s.seen > self.idle_s or now - s.created > self.lifetime_s

    async def get(self, session_id: str | None) -> Session | None:
        """The live session with this id (its idle clock restarted), or None."""
        await self._sweep()
        if not session_id:
            return None
        s = self._by_id.get(session_id)
        if s is None:
            return None
        now = time.monotonic()
        if self._expired(s, now):
            await self._drop(s, "expired")
            return None
        s.seen = now
        return s

    async def new(self) -> Session:
        """A fresh, signed-out session (for the sign-in form's CSRF token)."""
        while len(self._by_id) >= self.max_sessions:
            oldest = min(self._by_id.values(), key=lambda s: s.seen)
            await self._drop(oldest, "evicted")
        now = time.monotonic()
        s = Session(id=secrets.token_urlsafe(32), csrf=secrets.token_urlsafe(32),
                    created=now, seen=now)
        self._by_id[s.id] = s
        return s

    async def sign_in(self, old: Session, client: AsyncClient, principal: str, admin: bool,
                      authenticated: bool) -> Session:
        """Replace `old` by a new signed-in session (new id, new CSRF token) owning
        `client`."""
        await self._drop(old, "signed in")
        s = await self.new()
        s.client, s.principal, s.admin, s.authenticated = client, principal, admin, authenticated
        log.info("signed in", extra={"principal": principal or "-", "admin": admin,
                                     "sessions": len(self._by_id)})
        return s

    async def sign_out(self, s: Session) -> None:
        await self._drop(s, "signed out")

    async def close(self) -> None:
        for s in list(self._by_id.values()):
            await self._drop(s, "console stopping")

    async def _drop(self, s: Session, why: str) -> None:
        if self._by_id.pop(s.id, None) is None:
            return
        if s.client is not None:
            client, s.client = s.client, None
            log.info("session closed", extra={"principal": s.principal or "-", "why": why})
            try:
                await client.close()
            except Exception as exc:  # closing a channel must not fail a request
                log.warning("closing a session's client failed", extra={"error": str(exc)})

    async def _sweep(self) -> None:
        """Drop expired sessions (their clients closed) at most every 30 s, so an
        abandoned session's gRPC channel does not outlive its lifetime by much."""
        now = time.monotonic()
        if now - self._swept < _SWEEP_EVERY_S:
            return
        self._swept = now
        stale = [s for s in self._by_id.values() if self._expired(s, now)]
        if stale:
            await asyncio.gather(*(self._drop(s, "expired") for s in stale))


__all__ = ["COOKIE", "Session", "Sessions"]

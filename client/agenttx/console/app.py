"""The console's web application: Starlette routes over `agenttx.client` (docs/console.md).

Why this shape: every page is rendered on the server from what the service answers to the
signed-in person's own token, so the service's ownership and roles decide what each
person sees and may do; the console decides nothing of that. Forms post back, the
handler calls one RPC, stores its result (or its error in words) as a one-time message
and redirects (POST/redirect/GET), so a reload never repeats an action. The only script
is a static file that refreshes marked fragments (the status strip, the transactions
table) from their own URLs.

What it must never do: call the service with credentials other than the session's; act
on a POST without the session's CSRF token (HTTP 403, nothing changes); send a page
without the security headers (`SecurityHeaders`); render a token.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import pathlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import grpc
import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..client import TLS, AgentTxError, AsyncClient, TransactionStatus
from .sessions import COOKIE, Session, Sessions
from .words import describe

log = logging.getLogger(__name__)

HERE = pathlib.Path(__file__).parent
OPEN_STATUSES = (TransactionStatus.ACTIVE, TransactionStatus.AWAITING_ROLLBACK,
                 TransactionStatus.AWAITING_APPROVAL)
# Rows of the transactions table: pages of the service are read whole until this many
# rows matched the filters (the principal filter is applied here, after the service's).
TABLE_ROWS = 100
REFRESH_S = 5
MAX_REASON = 1024

# CSP: no inline script (and no inline style) anywhere; everything from this origin.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


@dataclass(frozen=True)
class Settings:
    target: str
    tls: TLS | None = None
    secure_cookie: bool = False      # the console serves TLS: the cookie says Secure
    idle_s: float = 1800.0
    lifetime_s: float = 43200.0
    timeout_s: float = 15.0


class SecurityHeaders:
    """ASGI middleware: every response (pages, fragments, static files, errors) carries
    the CSP, X-Frame-Options DENY, nosniff and Referrer-Policy; pages are not cached."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope.get("path", "").startswith("/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() not in {h for h, _ in SECURITY_HEADERS}]
                headers.extend(SECURITY_HEADERS)
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


# ---- formatting (Jinja filters) ----------------------------------------------------------

def _when(ts: float) -> str:
    if not ts:
        return "—"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(ts: float) -> str:
    if not ts:
        return "—"
    s = max(0, int(time.time() - ts))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _pretty(text: str) -> str:
    """JSON pretty-printed when it parses (history texts cut at 4 KiB do not: shown as
    they are)."""
    if not text:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _status_class(status: Any) -> str:
    return "status-" + str(getattr(status, "value", status)).lower().replace("_", "-")


# ---- the application ---------------------------------------------------------------------

class Console:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sessions = Sessions(idle_s=settings.idle_s, lifetime_s=settings.lifetime_s)
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                 autoescape=True, undefined=jinja2.StrictUndefined)
        env.filters.update(when=_when, age=_age, pretty=_pretty, status_class=_status_class)
        self.templates = Jinja2Templates(env=env)
        # Token-less: only to tell whether the service runs without authentication.
        self.probe = AsyncClient(settings.target, tls=settings.tls, timeout=settings.timeout_s)

    # -- plumbing
    def client(self, s: Session) -> AsyncClient:
        assert s.client is not None
        return s.client

    async def render(self, request: Request, name: str, session: Session | None,
                     status: int = 200, **context: Any) -> Response:
        """A page (or a fragment, `_*.html`). Whole pages of a signed-in person carry the
        status strip filled in (then refreshed by the script)."""
        if session is not None and session.signed_in and not name.startswith("_"):
            context.update(await self._status(session))
        context.update(session=session, target=self.settings.target, refresh_s=REFRESH_S,
                       flash=session.take_flash() if session is not None else [],
                       path=request.url.path)
        response = self.templates.TemplateResponse(request, name, context, status_code=status)
        if session is not None:
            self.set_cookie(response, session)
        return response

    def set_cookie(self, response: Response, session: Session) -> None:
        response.set_cookie(COOKIE, session.id, httponly=True, samesite="strict",
                            secure=self.settings.secure_cookie, path="/")

    def words(self, err: AgentTxError, action: str, topic: str, s: Session) -> str:
        return describe(err, action, topic=topic, who=s.who, target=self.settings.target)

    async def session(self, request: Request) -> Session | None:
        return await self.sessions.get(request.cookies.get(COOKIE))

    # -- route wrappers
    def page(self, handler: Callable[[Request, Session], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]:
        """A page for signed-in people; others are sent to the sign-in page (fragments
        answer 401, and the refresh script goes there itself)."""
        async def run(request: Request) -> Response:
            s = await self.session(request)
            if s is None or not s.signed_in:
                if request.url.path.endswith("/rows") or request.url.path == "/status":
                    return PlainTextResponse("signed out", status_code=401)
                return RedirectResponse("/signin", status_code=303)
            return await handler(request, s)
        return run

    def action(self, handler: Callable[[Request, Session, Any], Awaitable[Response]]
               ) -> Callable[[Request], Awaitable[Response]]:
        """A form POST: refused with 403 (nothing done) without the session's CSRF
        token; sent to sign in without a signed-in session."""
        async def run(request: Request) -> Response:
            s = await self.session(request)
            form = await request.form()
            if s is None or not s.check_csrf(form.get("csrf")):
                return await self.forbidden(request)
            if not s.signed_in:
                return RedirectResponse("/signin", status_code=303)
            return await handler(request, s, form)
        return run

    async def forbidden(self, request: Request) -> Response:
        log.warning("form refused: missing or wrong CSRF token",
                    extra={"path": request.url.path})
        return await self.render(request, "forbidden.html", None, status=403)

    # -- sign-in
    async def signin_page(self, request: Request) -> Response:
        s = await self.session(request)
        if s is not None and s.signed_in:
            return RedirectResponse("/transactions", status_code=303)
        if s is None:
            s = await self.sessions.new()
        return await self.render(request, "signin.html", s, **await self._probe())

    async def _probe(self) -> dict[str, Any]:
        """Whether a call without a token succeeds: the service runs without
        authentication (or is unreachable, which the page says)."""
        try:
            await self.probe.status()
        except AgentTxError as err:
            if err.code == grpc.StatusCode.UNAUTHENTICATED:
                return {"open_service": False, "unreachable": ""}
            return {"open_service": False, "unreachable": f"{err.code.name}: {err.details}"}
        return {"open_service": True, "unreachable": ""}

    async def signin(self, request: Request) -> Response:
        s = await self.session(request)
        form = await request.form()
        if s is None or not s.check_csrf(form.get("csrf")):
            return await self.forbidden(request)
        token = str(form.get("token") or "").strip()
        client = AsyncClient(self.settings.target, token=token or None, tls=self.settings.tls,
                             timeout=self.settings.timeout_s)
        try:
            status = await client.status()
        except AgentTxError as err:
            await client.close()
            if err.code == grpc.StatusCode.UNAUTHENTICATED:
                error = ("This service needs a token: paste yours." if not token else
                         f"The service refused this token ({err.details}). Check that you "
                         "pasted it whole, or ask for a new one.")
            else:
                error = describe(err, "Signing in", topic="transactions", who="nobody yet",
                                 target=self.settings.target)
            log.info("sign-in refused", extra={"code": err.code.name})
            return await self.render(request, "signin.html", s, status=401, error=error,
                                     **await self._probe())
        authenticated = bool(token) and bool(status.principal)
        s = await self.sessions.sign_in(s, client, status.principal, status.admin,
                                        authenticated)
        response = RedirectResponse("/transactions", status_code=303)
        self.set_cookie(response, s)
        return response

    async def signout(self, request: Request, s: Session, form: Any) -> Response:
        await self.sessions.sign_out(s)
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                               secure=self.settings.secure_cookie)
        return response

    # -- status strip
    async def _status(self, s: Session) -> dict[str, Any]:
        try:
            return {"status": await self.client(s).status(), "status_error": ""}
        except AgentTxError as err:
            return {"status": None, "status_error": self.words(
                err, "Reading the service's status", "transactions", s)}

    async def status(self, request: Request, s: Session) -> Response:
        return await self.render(request, "_status.html", s, **await self._status(s))

    # -- transactions
    def _filters(self, request: Request) -> dict[str, str]:
        q = request.query_params
        status = q.get("status", "")
        if status not in {st.value for st in OPEN_STATUSES}:
            status = ""
        return {"status": status, "principal": q.get("principal", "").strip(),
                "agent": q.get("agent", "").strip(), "page": q.get("page", "")}

    async def _rows(self, s: Session, f: dict[str, str]) -> dict[str, Any]:
        rows: list[Any] = []
        token, error = f["page"], ""
        try:
            while True:
                page = await self.client(s).list_page(
                    page_size=200, page_token=token, status=f["status"] or None,
                    agent_id_prefix=f["agent"])
                rows.extend(r for r in page.transactions
                            if not f["principal"] or r.principal == f["principal"])
                token = page.next_page_token
                if not token or len(rows) >= TABLE_ROWS:
                    break
        except AgentTxError as err:
            error, token = self.words(err, "Listing transactions", "transactions", s), ""
        keep = {k: v for k, v in f.items() if v and k != "page"}
        here = {**keep, "page": f["page"]} if f["page"] else keep
        return {"rows": rows, "error": error, "filters": f, "query": urlencode(keep),
                "rows_url": "/transactions/rows" + ("?" + urlencode(here) if here else ""),
                "next_page": urlencode({**keep, "page": token}) if token else ""}

    async def transactions(self, request: Request, s: Session) -> Response:
        return await self.render(request, "transactions.html", s,
                           **await self._rows(s, self._filters(request)),
                           statuses=[st.value for st in OPEN_STATUSES])

    async def transaction_rows(self, request: Request, s: Session) -> Response:
        return await self.render(request, "_rows.html", s, **await self._rows(s, self._filters(request)))

    async def lookup(self, request: Request, s: Session) -> Response:
        tx_id = request.query_params.get("id", "").strip()
        if not tx_id:
            s.say("error", "Give a transaction id to look up.")
            return RedirectResponse("/transactions", status_code=303)
        return RedirectResponse(f"/transactions/{quote(tx_id, safe='')}", status_code=303)

    async def transaction(self, request: Request, s: Session) -> Response:
        tx_id = request.path_params["tx_id"]
        client = self.client(s)
        try:
            history = await client.history(tx_id)
        except AgentTxError as err:
            status = 404 if err.code == grpc.StatusCode.NOT_FOUND else 502
            return await self.render(request, "transaction.html", s, status=status, tx_id=tx_id,
                               history=None, state=None, state_error="",
                               error=self.words(err, f"Transaction {tx_id}", "transactions", s))
        state, state_error = None, ""
        if not history.ended:
            try:
                state = await client.get(tx_id)
            except AgentTxError as err:
                state_error = self.words(err, "Reading its constraints and context log",
                                         "transactions", s)
        may_roll_back = not history.ended and (s.admin or s.principal == history.principal)
        return await self.render(request, "transaction.html", s, tx_id=tx_id, history=history,
                           state=state, state_error=state_error, error="",
                           may_roll_back=may_roll_back)

    async def rollback(self, request: Request, s: Session, form: Any) -> Response:
        tx_id = request.path_params["tx_id"]
        back = RedirectResponse(f"/transactions/{tx_id}", status_code=303)
        reason = str(form.get("reason") or "").strip()[:MAX_REASON]
        raw = str(form.get("to_step") or "").strip()
        to_step: int | None = None
        if raw:
            if not raw.isdigit() or int(raw) < 1:
                s.say("error", f"Roll back to step: give a step number (1 or more), not {raw!r}.")
                return back
            to_step = int(raw)
        reason = reason or f"rolled back from the console by {s.principal or 'anonymous'}"
        what = f"Rolling back to before step {to_step}" if to_step else "Rolling back (abort)"
        try:
            result = await self.client(s).rollback(tx_id, to_step, reason=reason)
        except AgentTxError as err:
            s.say("error", self.words(err, what, "rollback", s))
            return back
        if not result.rolled_back:
            s.say("error", f"{what} is incomplete: an undo failed, and the transaction waits "
                  f"for another rollback ({'; '.join(result.compensation_errors)}). "
                  f"{result.compensations_run} compensations ran.")
        elif to_step:
            s.say("ok", f"Rolled back to before step {to_step}: {result.compensations_run} "
                  f"compensations ran; the agent's next step is {result.next_step_id}.")
        else:
            s.say("ok", f"Rolled back: the transaction was aborted and everything it did "
                  f"undone ({result.compensations_run} compensations ran).")
        return back

    # -- approvals
    async def _approvals(self, s: Session) -> tuple[list[Any], str]:
        try:
            return [a async for a in self.client(s).approvals()], ""
        except AgentTxError as err:
            return [], self.words(err, "Listing approvals", "approvals", s)

    async def approvals(self, request: Request, s: Session) -> Response:
        items, error = await self._approvals(s)
        return await self.render(request, "approvals.html", s, approvals=items, error=error)

    async def approval(self, request: Request, s: Session) -> Response:
        tx_id = request.path_params["tx_id"]
        items, error = await self._approvals(s)
        found = next((a for a in items if a.transaction_id == tx_id), None)
        if found is None and not error:
            error = (f"No pending approval for transaction {tx_id} that you may decide: it "
                     "was decided or withdrawn already, it expired, or it is outside your "
                     "scope.")
        return await self.render(request, "approval.html", s, status=200 if found else 404,
                           approval=found, tx_id=tx_id, error=error)

    async def decide(self, request: Request, s: Session, form: Any) -> Response:
        tx_id = request.path_params["tx_id"]
        approve = request.path_params["decision"] == "approve"
        reason = str(form.get("reason") or "").strip()[:MAX_REASON]
        digest = str(form.get("digest") or "")
        what = f"{'Approving' if approve else 'Rejecting'} transaction {tx_id}"
        client = self.client(s)
        try:
            if approve:
                d = await client.approve(tx_id, digest, reason=reason)
            else:
                d = await client.reject(tx_id, reason)
        except AgentTxError as err:
            s.say("error", self.words(err, what, "approvals", s))
            return RedirectResponse(f"/approvals/{tx_id}", status_code=303)
        if d.status is TransactionStatus.COMMITTED:
            s.say("ok", f"Approved: transaction {tx_id} committed ({d.steps_committed} steps, "
                  f"{d.effects_dispatched} effects delivered"
                  + (f"; delivery errors, retried in the background: "
                     f"{'; '.join(d.dispatch_errors)}" if d.dispatch_errors else "") + ").")
        elif d.status is TransactionStatus.REJECTED:
            s.say("ok", f"Rejected: transaction {tx_id} was undone; its agent sees REJECTED "
                  "with your reason.")
        else:
            s.say("error", f"Approved, but transaction {tx_id} could not commit "
                  f"({d.status.value}): data it read changed since it was submitted, so it "
                  "was undone. The agent must redo the work.")
        return RedirectResponse("/approvals", status_code=303)

    # -- dead letters
    async def dead_letters(self, request: Request, s: Session) -> Response:
        try:
            letters, error = [d async for d in self.client(s).dead_letters()], ""
        except AgentTxError as err:
            letters, error = [], self.words(err, "Listing dead letters", "dead letters", s)
        return await self.render(request, "dead_letters.html", s, letters=letters, error=error)

    async def dead_letter(self, request: Request, s: Session, form: Any) -> Response:
        verb = request.path_params["verb"]
        key = str(form.get("key") or "")
        owner = str(form.get("principal") or "")
        reason = str(form.get("reason") or "").strip()[:MAX_REASON]
        back = RedirectResponse("/dead-letters", status_code=303)
        client = self.client(s)
        try:
            if verb == "retry":
                await client.retry_dead_letter(key, principal=owner,
                                               reason=reason or "retried from the console")
                s.say("ok", f"Dead letter {key} is back in the outbox: it is delivered again "
                      "with the same idempotency key within the dispatcher's poll interval.")
            else:
                await client.discard_dead_letter(key, reason, principal=owner)
                s.say("ok", f"Dead letter {key} was discarded; the reason is in the service's "
                      "audit log.")
        except AgentTxError as err:
            what = f"{'Retrying' if verb == 'retry' else 'Discarding'} dead letter {key}"
            s.say("error", self.words(err, what, "dead letters", s))
        return back

    # -- liveness
    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def root(self, request: Request) -> Response:
        return RedirectResponse("/transactions", status_code=303)

    def routes(self) -> list[Any]:
        return [
            Route("/", self.root),
            Route("/healthz", self.healthz),
            Route("/signin", self.signin_page, methods=["GET"]),
            Route("/signin", self.signin, methods=["POST"]),
            Route("/signout", self.action(self.signout), methods=["POST"]),
            Route("/status", self.page(self.status)),
            Route("/transactions", self.page(self.transactions)),
            Route("/transactions/rows", self.page(self.transaction_rows)),
            Route("/transactions/lookup", self.page(self.lookup)),
            Route("/transactions/{tx_id}", self.page(self.transaction)),
            Route("/transactions/{tx_id}/rollback", self.action(self.rollback),
                  methods=["POST"]),
            Route("/approvals", self.page(self.approvals)),
            Route("/approvals/{tx_id}", self.page(self.approval)),
            Route("/approvals/{tx_id}/{decision:str}", self.action(self.decide),
                  methods=["POST"]),
            Route("/dead-letters", self.page(self.dead_letters)),
            Route("/dead-letters/{verb:str}", self.action(self.dead_letter), methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]

    async def not_found(self, request: Request, exc: Exception) -> Response:
        s = await self.session(request)
        return await self.render(request, "not_found.html", s if s and s.signed_in else None,
                           status=404)

    async def method_not_allowed(self, request: Request, exc: Exception) -> Response:
        return PlainTextResponse("method not allowed", status_code=405)

    async def close(self) -> None:
        await self.sessions.close()
        await self.probe.close()


def build_app(settings: Settings) -> tuple[ASGIApp, Console]:
    console = Console(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await console.close()

    decisions = {"approve", "reject"}
    verbs = {"retry", "discard"}
    app = Starlette(routes=console.routes(), lifespan=lifespan,
                    exception_handlers={404: console.not_found,
                                        405: console.method_not_allowed})

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        """Unknown action names are 404 before any form is read."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        parts = path.strip("/").split("/")
        if scope["type"] == "http" and scope.get("method") == "POST" and (
                (parts[0] == "approvals" and len(parts) == 3 and parts[2] not in decisions)
                or (parts[0] == "dead-letters" and len(parts) == 2 and parts[1] not in verbs)):
            await PlainTextResponse("not found", status_code=404)(scope, receive, send)
            return
        await app(scope, receive, send)

    return SecurityHeaders(guarded), console


__all__ = ["CSP", "Console", "SecurityHeaders", "Settings", "build_app"]

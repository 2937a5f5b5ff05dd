"""Whether a failed delivery is worth another try: permanent versus transient refusals.

Why this module exists: the outbox retries a failed delivery with backoff until it is
confirmed, which is right for a receiver that is down or busy and wrong for one that
refused the request itself: a webhook answering 400 refuses the same body every time,
and retrying it forever hides it where nobody looks. So every channel reports its
failure as a `DeliveryError` that says which it was, and the dispatcher moves a
permanent one to the dead letters (docs/operations.md, "Dead letters") instead of
rescheduling it.

The rules (one table per protocol, here and nowhere else):

* HTTP: a 4xx answer is permanent, except 408 Request Timeout, 425 Too Early and
  429 Too Many Requests, which ask the client to come back later (RFC 9110 §15.5.9,
  RFC 8470 §5.2, RFC 6585 §4). 5xx, those three, a refused, dropped or reset
  connection and any timeout are transient. Other statuses (1xx and 3xx: redirects are
  not followed) are transient: never dropped by a guess, and visible in the outbox
  backlog metrics until someone fixes the channel's URL.
* SMTP: a 5xx reply is permanent, a 4xx reply transient (RFC 5321 §4.2.1).
* A request the channel cannot even build (a payload or key it cannot encode) is
  permanent: the same bytes would fail the same way on every attempt.

Nothing is ever dropped: a permanent refusal becomes a dead letter that an admin
retries or discards. Transient failures never become dead letters by themselves.
"""

from __future__ import annotations

# Client errors that mean "not now" rather than "never" (see the module docstring).
TRANSIENT_HTTP_4XX = frozenset({408, 425, 429})


class DeliveryError(Exception):
    """The receiver did not confirm the delivery. The message is safe to show a caller
    (never a secret: no header values, passwords or URL query strings). `permanent`: the
    receiver refused it for good, so it is not retried but moved to the dead letters."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def http_status_is_permanent(status: int) -> bool:
    """A non-2xx HTTP answer: True when retrying cannot change it."""
    return 400 <= status < 500 and status not in TRANSIENT_HTTP_4XX


def smtp_code_is_permanent(code: int) -> bool:
    """An SMTP reply code that refused the message: 5yz is permanent, 4yz transient."""
    return 500 <= code < 600


__all__ = ["TRANSIENT_HTTP_4XX", "DeliveryError", "http_status_is_permanent",
           "smtp_code_is_permanent"]

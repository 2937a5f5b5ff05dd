"""Secrets never reach logs or error texts
(docs/security.md#secrets-what-never-leaves-the-process): `redact` and `RedactFilter`."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from agenttx.auth import RedactFilter, redact
from agenttx.logs import JsonFormatter
from support.certs import ServiceAccountIssuer


@pytest.mark.parametrize("text, expected", [
    ("authorization: Bearer abc.def-123456789", "authorization: Bearer [REDACTED]"),
    ("metadata (('authorization', 'bearer s3cr3t-t0ken'),)",
     "metadata (('authorization', 'bearer [REDACTED]'),)"),
    ("Authorization=Basic dXNlcjpwYXNz", "Authorization=Basic [REDACTED]"),
    ("sent Bearer eyJhbGciOi.eyJzdWIi.c2ln to the server", "sent Bearer [REDACTED] to the server"),
    ("POST https://user:p%40ss@hooks.example.com/x failed: 500",
     "POST https://[REDACTED]@hooks.example.com/x failed: 500"),
    ("smtp://mailer:pa@ss@smtp.example.com:587", "smtp://[REDACTED]@smtp.example.com:587"),
    ("https://ghp_abcdef123456@github.com/org/repo", "https://[REDACTED]@github.com/org/repo"),
    ("GET /hook?token=abc123&page=2", "GET /hook?token=[REDACTED]&page=2"),
    ('{"smtp_password": "a b c", "user": "bob"}', '{"smtp_password": "[REDACTED]", "user": "bob"}'),
    ("login password=hunter2; api_key: k-123 client_secret='x y'",
     "login password=[REDACTED]; api_key: [REDACTED] client_secret='[REDACTED]'"),
    ("X-Api-Key: 0123abcd", "X-Api-Key: [REDACTED]"),
    ("key -----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY----- end",
     "key [REDACTED] end"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQ (truncated", "[REDACTED]"),
])
def test_secrets_are_replaced(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_a_real_service_account_token_is_removed_wherever_it_appears() -> None:
    token = ServiceAccountIssuer(alg="ES256").mint()
    assert redact(f"refused {token}!") == "refused [REDACTED]!"


@pytest.mark.parametrize("text", [
    "", "step 3 failed: duplicate key value violates unique constraint \"effects_pkey\"",
    "missing credentials", "invalid credentials", "expired credentials",
    "max-requests-per-s (5) exceeded for this principal", "tokens=3 max_tokens=5",
    "see https://example.com/docs?page=2#auth", "user@example.com wrote /tmp/a:b",
    "a bearer of bad news",
])
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text


HOSTILE = [  # ~200 KB each; a pattern that restarts inside runs takes minutes on these
    "a-" * 100_000 + "password", "eyJ-" * 50_000, "a-" * 100_000 + "://x", "x://" * 50_000,
    'password="' * 20_000, "password" + " " * 200_000 + "x", "bearer " * 28_000,
    "-----BEGIN " + "A" * 200_000, "@" * 200_000, '"' * 200_000, "http://" + "u:p@" * 50_000,
]


def test_runs_in_linear_time_on_hostile_input() -> None:
    started = time.perf_counter()
    for text in HOSTILE:
        redact(text)
    assert time.perf_counter() - started < 10.0  # ~1 s when linear


def test_unterminated_quoted_secret_is_still_removed() -> None:
    assert redact('{"password": "abc') == '{"password": "[REDACTED]'


def test_log_filter_redacts_message_and_extras() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactFilter())
    logger = logging.getLogger("test.redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("webhook %s failed", "https://u:pw@hook.example/x",
                       extra={"header": "Bearer abcdefgh12345", "attempt": 3,
                              "urls": ["smtp://a:b@mail.example", "plain"]})
    finally:
        logger.removeHandler(handler)
    doc = json.loads(stream.getvalue())
    assert doc["msg"] == "webhook https://[REDACTED]@hook.example/x failed"
    assert doc["header"] == "Bearer [REDACTED]"
    assert doc["attempt"] == 3
    assert doc["urls"] == ["smtp://[REDACTED]@mail.example", "plain"]

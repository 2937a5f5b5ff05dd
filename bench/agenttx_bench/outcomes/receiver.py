"""The webhook receiver every system's effects go to: a real HTTP server on loopback.

Why the benchmark owns one: effects are judged by what a receiver actually confirmed —
one entry per 2xx-answered POST, keyed by the `Idempotency-Key` header, so a duplicate
or a leaked delivery shows up exactly as a user's receiver would log it. It is also where
the `receiver_failure` fault is injected: `refuse(key, n)` makes it answer 503 to the
next `n` deliveries of that key (refused POSTs are attempts, not deliveries). And it is
how the runner knows AgentTx's outbox has settled without looking inside AgentTx:
`settle` waits (on a condition, not a clock) until every key it is given and every key
it has refused so far has been confirmed.

Nothing here dedupes: counting what arrives is the point.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from agenttx.testing.receivers import PostReceiver

from .state import Delivered


class Receiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._delivered: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        self._refuse: Counter[str] = Counter()
        self.attempts: Counter[str] = Counter()
        self._http = PostReceiver(self._on_post, "/effects", name="outcomes-receiver")
        self.url = self._http.url

    def _on_post(self, handler: BaseHTTPRequestHandler, body: bytes) -> int:
        return self._record(handler.headers.get("Idempotency-Key", ""), body)

    def _record(self, key: str, body: bytes) -> int:
        try:
            doc = json.loads(body)
        except ValueError:
            return 400
        with self._lock:
            self.attempts[key] += 1
            if self._refuse[key] > 0:
                self._refuse[key] -= 1
                return 503
            self._delivered[key].append((str(doc.get("channel", "")), doc.get("payload")))
            self._changed.notify_all()
        return 200

    def refuse(self, key: str, times: int) -> None:
        """Answer 503 to the next `times` deliveries of `key`."""
        with self._lock:
            self._refuse[key] += times

    def delivered(self, prefix: str) -> dict[str, Delivered]:
        """Confirmed deliveries of the keys starting with `prefix`."""
        with self._lock:
            return {key: Delivered(got[0][0], tuple(payload for _, payload in got))
                    for key, got in self._delivered.items() if key.startswith(prefix) and got}

    def _unconfirmed(self, prefix: str, keys: Iterable[str]) -> set[str]:
        tried = {k for k in self.attempts if k.startswith(prefix)}
        return {k for k in tried.union(keys) if not self._delivered.get(k)}

    def settle(self, prefix: str, keys: Iterable[str], timeout: float) -> set[str]:
        """Wait until each of `keys`, and each key starting with `prefix` that was
        attempted, has a confirmed delivery (a refused key is being redelivered). Returns
        the keys still unconfirmed after `timeout` seconds: empty when settled."""
        keys = set(keys)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                missing = self._unconfirmed(prefix, keys)
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._changed.wait(left)

    def start(self) -> Receiver:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Assertions shared by the integration tests: what a caller of the real service sees.

Every RPC error is checked for its exact status code AND a meaningful part of its
details (never UNKNOWN, never a traceback); every failed step for its category and a
one-line hint naming the concrete thing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc

from agenttx.contracts.layout import Keys
from agenttx.v1 import agenttx_pb2 as pb

TIMEOUT_S = 30.0
# The integration replicas' --etcd-prefix (tests/integration/conftest.py).
KEYS = Keys("/agenttx-it")

CATEGORIES = frozenset({
    "unique_violation", "not_null_violation", "foreign_key_violation", "no_data_found",
    "undefined_file", "invalid_text_representation", "invalid_parameter_value",
    "invalid_name", "undefined_function", "undefined_object", "undefined_column",
    "lock_not_available", "insufficient_privilege", "program_limit_exceeded",
})


def expect_error(call: Callable[..., Any], request: Any, code: grpc.StatusCode,
                 *fragments: str) -> grpc.RpcError:
    """Call an RPC that must fail with `code`; its details must contain every fragment."""
    try:
        call(request, timeout=TIMEOUT_S)
    except grpc.RpcError as err:
        details = err.details() or ""
        assert err.code() == code, f"expected {code.name}, got {err.code().name}: {details}"
        assert "Traceback" not in details, details
        for fragment in fragments:
            assert fragment in details, f"{fragment!r} not in details {details!r}"
        return err
    raise AssertionError(f"expected {code.name}, but the call succeeded")


def expect_failure(resp: pb.ExecuteStepResponse, category: str, *fragments: str) -> str:
    """A failed step: normal response, the category, a one-line hint naming `fragments`."""
    assert resp.status != pb.STEP_STATUS_SUCCESS, f"step succeeded: {resp.output_json}"
    assert resp.error_category == category, (resp.error_category, resp.clean_hint)
    hint = resp.clean_hint
    assert hint and "\n" not in hint and len(hint) <= 200, hint
    for fragment in fragments:
        assert fragment in hint, f"{fragment!r} not in hint {hint!r}"
    assert resp.output_json == ""
    assert hint in resp.constraints
    return hint


def output(resp: pb.ExecuteStepResponse) -> Any:
    assert resp.status == pb.STEP_STATUS_SUCCESS, (resp.error_category, resp.clean_hint)
    assert resp.strategy == pb.ROLLBACK_STRATEGY_NONE
    return json.loads(resp.output_json)


def get(stub: Any, tx: str) -> pb.GetTransactionResponse:
    return stub.GetTransaction(pb.GetTransactionRequest(transaction_id=tx), timeout=TIMEOUT_S)


def ended(stub: Any, tx: str) -> bool:
    """Whether the transaction is gone (GetTransaction answers NOT_FOUND). Note that a
    GetTransaction is activity: poll more slowly than an idle timeout you wait for."""
    try:
        stub.GetTransaction(pb.GetTransactionRequest(transaction_id=tx), timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.NOT_FOUND
    return False

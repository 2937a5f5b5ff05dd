"""The one table from domain errors to gRPC status codes (applied in api.servicer).

Anything not in the table is a bug: it is logged with its traceback and answered
INTERNAL with a generic message, never UNKNOWN and never with the traceback.
"""

from __future__ import annotations

import grpc

from .. import errors

STATUS_BY_ERROR: tuple[tuple[type[errors.AgentTxError], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Conflict, grpc.StatusCode.ABORTED),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.StoreUnavailable, grpc.StatusCode.UNAVAILABLE),  # before its base class
    (errors.StoreError, grpc.StatusCode.INTERNAL),
)


def status_for(exc: errors.AgentTxError) -> grpc.StatusCode:
    for cls, code in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL

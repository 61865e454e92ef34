"""The one place where Quail errors become gRPC status codes."""

from __future__ import annotations

import grpc

from quail.engine import errors

STATUS = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}


def status_of(err: errors.QuailError) -> grpc.StatusCode:
    """The status of an error class (its nearest mapped ancestor); UNKNOWN if none."""
    for cls in type(err).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return grpc.StatusCode.UNKNOWN

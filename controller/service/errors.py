"""Refusals mapped to gRPC status codes and HTTP problems, in one place."""

from __future__ import annotations

import functools
import logging

import grpc

from controller.core.errors import (
    FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, RequestError, RetryLater,
)
from controller.store import StoreError
from protos.dial import LEADER_METADATA_KEY

log = logging.getLogger("fthsdp.controller")


class NotLeader(Exception):
    """This controller is a standby (or was just deposed): try the leader, at
    `leader_address` when this controller knows it."""

    def __init__(self, message: str, leader_address: str = "") -> None:
        super().__init__(message)
        self.leader_address = leader_address


def trailing_metadata(exc: Exception) -> tuple[tuple[str, str], ...]:
    """What a refusal carries besides its code and message: a standby names the leader."""
    address = getattr(exc, "leader_address", "")
    return ((LEADER_METADATA_KEY, address),) if address else ()


GRPC_CODES: dict[type, grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    NotFound: grpc.StatusCode.NOT_FOUND,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    RetryLater: grpc.StatusCode.ABORTED,
    NotLeader: grpc.StatusCode.UNAVAILABLE,
    StoreError: grpc.StatusCode.UNAVAILABLE,
}

HTTP_STATUS: dict[type, int] = {
    InvalidArgument: 400,
    NotFound: 404,
    PermissionDenied: 403,
    FailedPrecondition: 409,
    RetryLater: 503,
    NotLeader: 503,
    StoreError: 503,
}


def _lookup(table: dict, exc: Exception):
    for kind in type(exc).__mro__:
        if kind in table:
            return table[kind]
    return None


def grpc_code(exc: Exception) -> grpc.StatusCode | None:
    return _lookup(GRPC_CODES, exc)


def http_status(exc: Exception) -> int | None:
    return _lookup(HTTP_STATUS, exc)


def unary(handler):
    """Wrap a unary gRPC handler: refusals become status codes with the message."""

    @functools.wraps(handler)
    async def wrapper(self, request, context):
        try:
            return await handler(self, request, context)
        except (RequestError, NotLeader, StoreError) as exc:
            refuse(context, handler.__name__, exc)
            return None

    return wrapper


def refuse(context, what: str, exc: Exception) -> None:
    """Answer a refused call with its status code and message; the handler then returns (a
    stream just ends). Not `context.abort()`: the exception it raises ends up in a reference
    cycle with the call and its request, which would keep every refused request, however large,
    alive until a full garbage collection."""
    if not isinstance(exc, (NotLeader, StoreError)):
        log.info("refused %s: %s", what, exc)
    context.set_code(grpc_code(exc))
    context.set_details(str(exc))
    metadata = trailing_metadata(exc)
    if metadata:
        context.set_trailing_metadata(metadata)


__all__ = ["LEADER_METADATA_KEY", "NotLeader", "grpc_code", "http_status", "refuse", "trailing_metadata", "unary",
           "RequestError"]

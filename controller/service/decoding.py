"""Requests that are not the message they claim to be answer INVALID_ARGUMENT, naming the
method and the byte count, instead of gRPC's UNKNOWN ("Unexpected DecodeError").

`guard(handlers)` wraps every method handler: its deserializer keeps a failure as an
`Undecodable` value instead of raising inside gRPC, and its behaviour answers one with
INVALID_ARGUMENT (a stream's request iterator ends there, with that status)."""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError


class Undecodable:
    __slots__ = ("size", "why")

    def __init__(self, size: int, why: str) -> None:
        self.size, self.why = size, why


def _deserializer(parse, what: str):
    def deserialize(data: bytes):
        try:
            return parse(data)
        except DecodeError as exc:
            return Undecodable(len(data), f"{what}: a request of {len(data)} bytes is not a valid message: "
                                          f"{str(exc)[:200]}")
    return deserialize


def _refuse(context, bad: Undecodable) -> None:
    context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
    context.set_details(bad.why)


def _unary_request(behaviour):
    async def handle(request, context):
        if isinstance(request, Undecodable):
            _refuse(context, request)
            return None
        return await behaviour(request, context)
    return handle


def _unary_request_stream(behaviour):
    async def handle(request, context):
        if isinstance(request, Undecodable):
            _refuse(context, request)
            return
        async for answer in behaviour(request, context):
            yield answer
    return handle


def _streamed_requests(behaviour, is_generator: bool):
    async def requests(request_iterator, context):
        async for request in request_iterator:
            if isinstance(request, Undecodable):
                _refuse(context, request)
                return
            yield request

    if is_generator:
        async def handle(request_iterator, context):
            async for answer in behaviour(requests(request_iterator, context), context):
                yield answer
    else:
        async def handle(request_iterator, context):
            return await behaviour(requests(request_iterator, context), context)
    return handle


def guard(service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> dict[str, grpc.RpcMethodHandler]:
    out = {}
    for name, h in handlers.items():
        fields = {"request_deserializer": _deserializer(h.request_deserializer, f"{service}/{name}")}
        if h.unary_unary is not None:
            fields["unary_unary"] = _unary_request(h.unary_unary)
        elif h.unary_stream is not None:
            fields["unary_stream"] = _unary_request_stream(h.unary_stream)
        elif h.stream_unary is not None:
            fields["stream_unary"] = _streamed_requests(h.stream_unary, is_generator=False)
        else:
            fields["stream_stream"] = _streamed_requests(h.stream_stream, is_generator=True)
        out[name] = h._replace(**fields)
    return out


__all__ = ["Undecodable", "guard"]

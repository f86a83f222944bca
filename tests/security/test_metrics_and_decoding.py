"""The smaller holes of issue 23: /metrics behind the read token when one is set, and bytes
that are not the message a method takes answered INVALID_ARGUMENT (not UNKNOWN), on every kind
of call, with the controller unchanged and still serving."""

from __future__ import annotations

import grpc
import httpx
import pytest

from .harness import expect_refused, picture, start_controller

pytestmark = pytest.mark.slow
READ_TOKEN = "r3ad-token"
NOT_A_MESSAGE = b"\x0a\xff\xff"  # a length-delimited field longer than the bytes that follow


def test_metrics_need_the_read_token_when_one_is_set(tmp_path):
    token = tmp_path / "read-token"
    token.write_text(READ_TOKEN)
    ctl = start_controller("--read-token-file", str(token))
    try:
        assert httpx.get(f"{ctl.http}/metrics", timeout=10).status_code == 401
        assert httpx.get(f"{ctl.http}/metrics", headers={"Authorization": "Bearer wrong"},
                         timeout=10).status_code == 403
        scraped = httpx.get(f"{ctl.http}/metrics", headers={"Authorization": f"Bearer {READ_TOKEN}"}, timeout=10)
        assert scraped.status_code == 200 and "fthsdp_" in scraped.text
    finally:
        ctl.stop()


def _identity(data: bytes) -> bytes:
    return data


@pytest.mark.parametrize("method, kind", [("Quorum", "unary"), ("RegisterAgent", "unary"), ("ReportStep", "unary"),
                                          ("Orders", "server stream"), ("Heartbeat", "stream"),
                                          ("QuorumStream", "stream")])
async def test_undecodable_requests_answer_invalid_argument(target, legit, method, kind):
    before = await picture(target.ctl.http)
    path = f"/fthsdp.v1.Controller/{method}"
    async with grpc.aio.insecure_channel(target.ctl.grpc) as channel:
        if kind == "unary":
            call = channel.unary_unary(path, request_serializer=_identity, response_deserializer=_identity)(
                NOT_A_MESSAGE, timeout=10)
        else:
            async def one():
                yield NOT_A_MESSAGE
            stub = (channel.unary_stream(path, request_serializer=_identity, response_deserializer=_identity)
                    if kind == "server stream" else
                    channel.stream_stream(path, request_serializer=_identity, response_deserializer=_identity))
            call = stub(NOT_A_MESSAGE if kind == "server stream" else one(), timeout=10).read()
        await expect_refused(call, grpc.StatusCode.INVALID_ARGUMENT, method, "a request of 3 bytes is not a valid")
    assert await picture(target.ctl.http) == before
    await legit.still_served(target.ctl.http)

"""FtarSettings.validate: full sentences that name the bad value."""

from __future__ import annotations

import dataclasses

import pytest

from ftar_kernels import FtarEndpoint, FtarSettings


def test_defaults_follow_the_paper_and_are_valid():
    s = FtarSettings(auth_key=bytes(32)).validate()
    assert (s.chunk_bytes, s.chunks_in_flight, s.cuda_blocks, s.cuda_threads_per_block) == (8 << 20, 2, 2, 512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.chunk_bytes = 1  # type: ignore[misc]


@pytest.mark.parametrize("field,value", [
    ("chunk_bytes", 0), ("chunk_bytes", 100), ("chunk_bytes", 4096.0), ("chunks_in_flight", 0),
    ("chunks_in_flight", 65), ("timeout_s", 0), ("timeout_s", -1.0), ("connect_timeout_s", 0.0),
    ("cuda_blocks", 0), ("cuda_threads_per_block", 500), ("cuda_threads_per_block", 2048),
    ("socket_buffer_bytes", -1), ("cpu_fold_bytes", 0), ("cpu_fold_bytes", 1000),
])
def test_bad_value_is_named_in_a_sentence(field, value):
    with pytest.raises(ValueError) as info:
        FtarSettings(**{field: value, "auth_key": bytes(32)}).validate()
    message = str(info.value)
    assert message.startswith(field) and repr(value) in message and message.endswith(".")


def test_endpoint_refuses_invalid_settings():
    with pytest.raises(ValueError, match="chunks_in_flight"):
        FtarEndpoint(settings=FtarSettings(chunks_in_flight=0, auth_key=bytes(32)))


def test_an_endpoint_without_a_key_refuses_to_start_unless_allowed_to():
    with pytest.raises(ValueError, match="give auth_key .* or set allow_unauthenticated=True"):
        FtarEndpoint(settings=FtarSettings())
    with pytest.raises(ValueError, match="at least 32 bytes, got 8 bytes"):
        FtarSettings(auth_key=b"12345678").validate()
    with FtarEndpoint(settings=FtarSettings(allow_unauthenticated=True)) as ep:
        ep.configure("g", 1, [ep.address])
    shown = repr(FtarSettings(auth_key=b"k" * 32))
    assert "auth_key" not in shown and "kkkk" not in shown

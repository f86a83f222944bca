"""The catch-up stream tag (fthsdp/state/stream.py, `StreamTag`), pure: what it detects and what
it does not depend on. Both ends of a transfer compute it on their own, over the same bytes
grouped into parts their own way."""

from __future__ import annotations

import numpy as np
import pytest

from fthsdp.state.stream import BLOCK_BYTES, PART_BYTES, PIECE_BYTES, StreamTag

KEY, NONCE = b"k" * 32, b"n" * 16


def _piece(nbytes: int, seed: int = 0) -> bytearray:
    return bytearray(np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes())


def _tag(pieces, part_bytes: int = PART_BYTES, key: bytes = KEY, nonce: bytes = NONCE) -> bytes:
    tag = StreamTag(key, nonce)
    tag.update_bytes(b"head")
    for piece in pieces:
        view = memoryview(bytes(piece))
        for lo in range(0, len(view), part_bytes):
            tag.update_part(view[lo:lo + part_bytes])
        tag.end_piece()
    return tag.value()


# three blocks and a partial one, so every kind of position below exists
SIZE = 3 * BLOCK_BYTES + 100


@pytest.mark.parametrize("part_bytes", [BLOCK_BYTES, 2 * BLOCK_BYTES, PART_BYTES])
def test_the_tag_does_not_depend_on_how_an_end_splits_a_piece_into_parts(part_bytes):
    piece = _piece(SIZE)
    assert _tag([piece], part_bytes) == _tag([piece])


@pytest.mark.parametrize("where", [0, BLOCK_BYTES - 1, 2 * BLOCK_BYTES + 8, SIZE - 1],
                         ids=["first byte", "end of a block", "middle block", "partial last block"])
def test_a_flipped_bit_anywhere_changes_the_tag(where):
    piece = _piece(SIZE)
    damaged = bytearray(piece)
    damaged[where] ^= 0x10
    assert _tag([damaged]) != _tag([piece])


def test_swapped_blocks_a_dropped_word_and_a_moved_piece_boundary_change_the_tag():
    piece = _piece(SIZE)
    swapped = piece[BLOCK_BYTES:2 * BLOCK_BYTES] + piece[:BLOCK_BYTES] + piece[2 * BLOCK_BYTES:]
    dropped = piece[:8] + piece[16:]
    assert len({_tag([piece]), _tag([swapped]), _tag([dropped])}) == 3
    assert _tag([piece[:BLOCK_BYTES], piece[BLOCK_BYTES:]]) != _tag([piece[:2 * BLOCK_BYTES], piece[2 * BLOCK_BYTES:]])


def test_the_tag_is_bound_to_the_key_and_to_the_request_nonce():
    piece = _piece(SIZE)
    assert len({_tag([piece]), _tag([piece], key=b"x" * 32), _tag([piece], nonce=b"m" * 16)}) == 3


def test_parts_that_break_the_layout_are_refused_naming_the_problem():
    tag = StreamTag(KEY, NONCE)
    tag.update_part(memoryview(bytes(BLOCK_BYTES + 1)))
    with pytest.raises(ValueError, match="did not end on a block"):
        tag.update_part(memoryview(bytes(BLOCK_BYTES)))
    tag = StreamTag(KEY, NONCE)
    with pytest.raises(ValueError, match=f"at most {PIECE_BYTES} bytes"):
        tag.update_part(memoryview(bytes(PIECE_BYTES + BLOCK_BYTES)))

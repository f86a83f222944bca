"""bench.limits' socket ceilings move every byte, woken at each arrival or once 512 KiB is queued."""

import threading

import pytest

from bench import limits
from tests.sockets import loopback_pair


@pytest.mark.parametrize("woken", [False, True], ids=["at each arrival", "a part at a time"])
@pytest.mark.parametrize("streams", [1, 2])
def test_the_streams_of_two_processes_finish_and_give_a_rate(streams, woken):
    gbs = limits.measure_tcp(streams, total=24 << 20, repeats=1, buffer_bytes=1 << 20, woken=woken)
    assert 0 < gbs < 1000


@pytest.mark.parametrize("woken", [False, True], ids=["at each arrival", "a part at a time"])
def test_the_receiver_takes_exactly_the_bytes_sent_through_its_buffer_in_turn(woken):
    with loopback_pair() as (sender, reader):
        data = bytes(range(251)) * 4099  # not a multiple of the buffer: the walk wraps mid-buffer
        out = memoryview(bytearray(100_003))
        t = threading.Thread(target=sender.sendall, args=(data,))
        t.start()
        limits._recv(reader, len(data), out, woken)
        t.join(30)
        tail = len(data) % len(out)
        assert bytes(out[:tail]) == data[-tail:]
        sender.close()
        assert reader.recv(1) == b""  # nothing past `total` was sent, and none was left unread

"""bench.semisync's paced FTAR transport: a send the socket takes at once is counted when the
link only counts (veth), and refused when the bucket paces (the sender thread waits for it)."""

from __future__ import annotations

from bench.semisync_link import Pacer, paced_transport


def test_a_send_taken_at_once_is_counted_on_a_counting_link_and_left_to_the_bucket_on_a_paced_one():
    for rate, taken in ((0, 1000), (1e6, 0)):
        pacer = Pacer(rate)
        transport = paced_transport(pacer, 0)
        listener = transport.listen("127.0.0.1", 0)
        dialled = transport.dial(listener.address, 5.0)
        accepted = listener.accept(5.0)
        try:
            assert dialled.try_send(bytes(1000)) == taken
            assert pacer.sent == taken
            if taken:
                got = memoryview(bytearray(taken))
                accepted.recv_exact(got, 5.0)
                assert bytes(got) == bytes(taken)
        finally:
            for conn in (dialled, accepted):
                conn.close()
            listener.close()

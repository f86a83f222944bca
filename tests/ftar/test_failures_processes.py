"""A peer killed mid-operation, survivors re-forming the ring, and a stale peer being refused."""

from __future__ import annotations

import pytest

from ftar_kernels import FtarEndpoint, FtarSettings, RecoverableError

from .cluster import KEY, Cluster, expected_sum, tensor_bytes

pytestmark = pytest.mark.slow
TIMEOUT_S = 5.0


def test_sigkill_mid_operation_then_survivors_reconfigure_and_refuse_a_stale_peer():
    cluster = Cluster(3, chunk_bytes=4096, chunks_in_flight=2, timeout_s=TIMEOUT_S, connect_timeout_s=5.0)
    try:
        everyone, survivors, victim = [0, 1, 2], [0, 1], 2
        assert all(a.ok for a in cluster.configure(everyone, "job/rank0", 1))
        # Slow every send down (about 150 chunks x 50 ms per rank), so the kill lands mid-operation.
        assert all(a.ok for a in cluster.run(everyone, "delay", (0.05,), (0.05,), (0.05,)))
        for pos, i in enumerate(everyone):
            cluster.send(i, "allreduce", 200_000, "float32", 5, pos, 60.0)
        for i in everyone:
            cluster.wait_started(i)
        cluster.kill(victim)

        # Every survivor fails recoverably, within its own timeout (plus process slack).
        answers = [cluster.answer(i, timeout_s=TIMEOUT_S + 10) for i in survivors]
        assert [a.ok for a in answers] == [False, False], answers
        assert {a.value[0] for a in answers} == {"RecoverableError"}, answers
        assert [a.value for a in cluster.run(survivors, "state", (), ())] == ["aborted", "aborted"]

        # The survivors re-form the ring without the victim (new generation) and sum correctly.
        assert all(a.ok for a in cluster.run(survivors, "delay", (0.0,), (0.0,)))
        assert all(a.ok for a in cluster.configure(survivors, "job/rank0", 2))
        answers = cluster.allreduce(survivors, 10_001, "float32", 9)
        assert all(a.ok for a in answers), answers
        assert answers[0].value["data"] == answers[1].value["data"] == \
            tensor_bytes(expected_sum(10_001, "float32", 9, 2))

        # A peer still at generation 1 is refused, and the current ring is not disturbed.
        with FtarEndpoint("127.0.0.1", 0, FtarSettings(connect_timeout_s=2.0, auth_key=KEY)) as stale:
            with pytest.raises(RecoverableError, match="stale"):
                stale.configure("job/rank0", 1, [stale.address, cluster.addresses[0]])
        answers = cluster.allreduce(survivors, 3000, "bfloat16", 4)
        assert all(a.ok for a in answers), answers
        assert answers[0].value["data"] == tensor_bytes(expected_sum(3000, "bfloat16", 4, 2))
    finally:
        cluster.close()

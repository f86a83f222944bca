"""bench.quorum measures what it says: every round checked, every field present (no speed asserts)."""

import pytest

from bench import quorum
from protos import controller_pb2 as pb


def reply(qid: int, members: int, step: int) -> pb.QuorumResponse:
    return pb.QuorumResponse(quorum_id=qid, max_step=step,
                             members=[pb.Member(replica_id=f"r{i}", step=step, healthy=True) for i in range(members)])


def test_a_round_that_is_not_one_quorum_of_every_leader_is_refused():
    quorum.check_answers([reply(7, 2, 3), reply(7, 2, 3)], replicas=2, step=3)
    with pytest.raises(quorum.BadRound, match=r"quorum ids \[7, 8\]"):
        quorum.check_answers([reply(7, 2, 3), reply(8, 2, 3)], replicas=2, step=3)
    with pytest.raises(quorum.BadRound, match=r"member counts \[1\]"):
        quorum.check_answers([reply(7, 1, 3), reply(7, 1, 3)], replicas=2, step=3)
    with pytest.raises(quorum.BadRound, match=r"max steps \[2\]"):
        quorum.check_answers([reply(7, 2, 2), reply(7, 2, 2)], replicas=2, step=3)


def test_turns_are_taken_in_blocks_and_every_system_gets_its_rounds():
    calls = []
    systems = {name: (lambda name=name: calls.append(name) or 1.0) for name in ("a", "b")}
    latencies = quorum.take_turns(systems, rounds=7)
    assert {k: len(v) for k, v in latencies.items()} == {"a": 7, "b": 7}
    timed = calls[2 * quorum.WARMUP_ROUNDS:]
    assert timed[:quorum.BLOCK_ROUNDS] == ["a"] * quorum.BLOCK_ROUNDS
    assert timed[quorum.BLOCK_ROUNDS:2 * quorum.BLOCK_ROUNDS] == ["b"] * quorum.BLOCK_ROUNDS


def test_a_real_controller_answers_stream_unary_and_new_id_rounds():
    result = quorum.measure(2, 3, unary=True, new_id=True)
    assert result["replicas"] == 2 and result["rounds"] == 3 and result["store"] == "memory"
    for prefix in ("", "unary_", "new_id_", "report_"):
        assert result[f"{prefix}p50_ms"] > 0 and result[f"{prefix}p99_ms"] >= result[f"{prefix}p50_ms"]

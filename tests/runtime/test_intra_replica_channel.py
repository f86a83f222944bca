"""The leader's fan-out + vote channel over real loopback sockets."""

from __future__ import annotations

import threading

import pytest

from fthsdp.channel_simulation import simulate_fanout_and_vote
from fthsdp.commit_votes import Outcome, Vote
from fthsdp.intra_replica_channel import ChannelError, LeaderChannel, RankChannel


@pytest.fixture
def leader():
    channel = LeaderChannel("127.0.0.1", 0, 3).start()
    yield channel
    channel.close()


def _ranks(leader: LeaderChannel) -> list[RankChannel]:
    ranks = [RankChannel(leader.address, r).connect(5.0) for r in (1, 2)]
    leader.wait_for_ranks(5.0)
    return ranks


def test_plan_fans_out_and_all_yes_commits(leader):
    ranks = _ranks(leader)
    leader.broadcast({"t": "plan", "view": {"quorum_id": 4}})
    assert [r.recv(5.0)["view"]["quorum_id"] for r in ranks] == [4, 4]
    for r in ranks:
        r.send({"t": "vote", "rank": r.rank, "quorum_id": 4, "step": 2, "ok": True})
    assert leader.collect_votes(4, 2, Vote(0, 4, 2, True), 5.0).outcome is Outcome.COMMIT


def test_one_no_vote_retries(leader):
    ranks = _ranks(leader)
    ranks[0].send({"t": "vote", "rank": 1, "quorum_id": 4, "step": 2, "ok": False, "reason": "ftar timeout"})
    decision = leader.collect_votes(4, 2, Vote(0, 4, 2, True), 5.0)
    assert (decision.outcome, "ftar timeout" in decision.reason) == (Outcome.RETRY, True)


def test_a_rank_that_disconnects_votes_no(leader):
    ranks = _ranks(leader)
    ranks[0].send({"t": "vote", "rank": 1, "quorum_id": 4, "step": 2, "ok": True})
    ranks[1].close()
    decision = leader.collect_votes(4, 2, Vote(0, 4, 2, True), 5.0)
    assert decision.outcome is Outcome.RETRY and "rank 2 voted no: disconnected" in decision.reason


def test_silent_rank_retries_after_the_vote_deadline(leader):
    ranks = _ranks(leader)
    decision = leader.collect_votes(4, 2, Vote(0, 4, 2, True), 0.05)
    assert len(ranks) == 2  # still connected: silent, not gone
    assert decision.outcome is Outcome.RETRY and "did not vote in time" in decision.reason


def test_votes_arriving_from_threads_while_collecting(leader):
    ranks = _ranks(leader)
    threads = [threading.Thread(target=r.send, args=({"t": "vote", "rank": r.rank, "quorum_id": 1, "step": 0,
                                                       "ok": True},)) for r in ranks]
    for t in threads:
        t.start()
    assert leader.collect_votes(1, 0, Vote(0, 1, 0, True), 5.0).outcome is Outcome.COMMIT
    for t in threads:
        t.join()


def test_rank_gives_a_clear_error_when_no_leader_listens():
    with pytest.raises(ChannelError, match="could not reach its leader"):
        RankChannel("127.0.0.1:1", 1).connect(0.2)


def test_simulated_round_with_many_ranks_commits():
    timings = simulate_fanout_and_vote(256, timeout_s=30.0)
    assert timings.outcome == "commit"
    assert 0 <= timings.fanout_s <= timings.decision_s

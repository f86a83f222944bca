"""The coordination with relays, pure and on a fake clock: 9 ranks in groups of 3 (ranks 0..2 talk
to the coordinator on connections 10..12; relays on connections 21 and 22 serve ranks 3..5 and 6..8)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib

import pytest

from fthsdp.step import coordination as co
from fthsdp.step import messages as msg
from fthsdp.step import relay_messages as rm
from protos import replica_pb2 as rpb
from tests.runtime.protocol_helpers import SETTINGS, answer
from tests.runtime.test_coordination import Core

S = dataclasses.replace(SETTINGS, world_size=9, relay_fanout=3, digest_every_steps=1).validate()
G = S.gather_timeout_s
LINKS = {1: 21, 2: 22}
MEMBERS = (("a", 5, True), ("b", 5, True))


def hello(rank: int) -> rpb.RankFrame:
    return msg.hello(rank, 9, "j", "b", f"f{rank}", f"s{rank}", "i")


class Relayed(Core):
    def __init__(self, hellos: bool = True) -> None:
        super().__init__(S, hello=False)
        if hellos:
            for group, conn in LINKS.items():
                assert self.send(conn, rm.relay_hello(group, 3, 9, "j", "b", f"127.0.0.1:{700 + group}", "i")) == []
            for rank in range(3):
                assert self.send(10 + rank, hello(rank)) == []
            for rank in range(3, 9):
                effects = self.send(LINKS[rank // 3], rm.relayed(rank, hello(rank)))
                assert effects == [] or self.c.stage is co.Stage.READY

    def begin_all(self, step: int = 5) -> list:
        effects = []
        for rank in range(3):
            effects += self.send(10 + rank, msg.begin(step))
        for group, conn in LINKS.items():
            effects += self.send(conn, rm.group_begin(step, range(3 * group, 3 * group + 3)))
        return effects

    def planned(self, step: int = 5, addresses: bool = False) -> list:
        (request,) = self.begin_all(step)
        assert isinstance(request, co.RequestQuorum)
        return self.feed(co.QuorumAnswered(answer(max_step=step, members=MEMBERS, recover=(), world=9,
                                                  addresses=addresses)))

    def direct_votes(self, attempt: int = 1) -> list:
        effects = []
        for rank in range(3):
            effects += self.send(10 + rank, msg.vote(attempt, True, "", 1.0, 10))
        return effects

    def snapshot(self) -> tuple:
        c = self.c
        return (c.stage, dict(c.conn_of), dict(c.link_group), dict(c.begins), set(c.round.voted),
                dict(c.round.digests), c.round.loss_sum, c.round.tokens, c.attempt)


def decisions(effects) -> list:
    return [e.frame.decision for e in effects if isinstance(e, co.Broadcast) and e.frame.HasField("decision")]


def test_relayed_hellos_bind_the_group_to_its_relay_and_the_quorum_has_every_address():
    core = Relayed()
    assert core.c.stage is co.Stage.READY
    assert {r: core.c.conn_of[r] for r in range(9)} == {0: 10, 1: 11, 2: 12, 3: 21, 4: 21, 5: 21, 6: 22, 7: 22, 8: 22}
    assert sorted(core.c.links()) == [10, 11, 12, 21, 22]  # a broadcast is written 5 times, not 9
    assert core.c.relay_address(4) == "127.0.0.1:701" and core.c.relay_address(1) == ""
    (request,) = core.begin_all()
    assert request.ftar_addresses == tuple(f"f{k}" for k in range(9))


def test_a_new_quorum_goes_to_each_relay_as_one_frame_holding_its_ranks_columns():
    core = Relayed()
    (each,) = core.planned(addresses=True)
    by_conn = dict(each.frames)
    assert sorted(by_conn) == [10, 11, 12, 21, 22]
    parts = rm.decode_to_ranks(by_conn[22].to_ranks)
    assert [(rank, kind) for rank, kind, _ in parts] == [(6, "plan"), (7, "plan"), (8, "plan")]
    plan = rpb.CoordinatorFrame.FromString(parts[1][2]).plan
    assert list(plan.peers.ftar_addresses) == ["fa7", "fb7"]  # rank 7's own column


def test_a_group_all_yes_commits_with_the_groups_sums():
    core = Relayed()
    core.planned()
    assert core.direct_votes() == []
    assert core.send(21, rm.group_vote(1, True, [3, 4, 5], "", 3.0, 30)) == []
    effects = core.send(22, rm.group_vote(1, True, [6, 7, 8], "", 3.0, 30))
    (decision,) = decisions(effects)
    assert decision.outcome == rpb.StepDecision.COMMIT and "all 9 ranks voted yes" in decision.reason
    assert core.c.stage is co.Stage.DIGESTS
    digests = {k: hashlib.sha256(bytes([k])).digest() for k in range(9)}
    for rank in range(3):
        assert core.send(10 + rank, msg.digest(1, 5, digests[rank])) == []
    assert core.send(21, rm.group_digests(1, 5, [(k, digests[k]) for k in (3, 4, 5)])) == []
    (report,) = core.send(22, rm.group_digests(1, 5, [(k, digests[k]) for k in (6, 7, 8)]))
    assert isinstance(report, co.ReportStep) and (report.loss, report.tokens) == (1.0, 90)
    assert report.digest == hashlib.sha256(b"".join(digests[k] for k in range(9))).hexdigest()


def test_a_groups_first_no_retries_with_its_reason():
    core = Relayed()
    core.planned()
    core.direct_votes()
    effects = core.send(21, rm.group_vote(1, False, [4], "rank 4 voted no: all-reduce timed out"))
    (decision,) = decisions(effects)
    assert decision.outcome == rpb.StepDecision.RETRY and decision.reason == "rank 4 voted no: all-reduce timed out"
    assert any(isinstance(e, co.ReportFailure) and not e.dead for e in effects) and core.c.stage is co.Stage.READY
    assert decisions(core.send(22, rm.group_vote(1, True, [6, 7, 8], "", 3.0, 30))) == []  # decided: ignored


def test_a_silent_group_is_retried_at_the_vote_timeout_naming_its_ranks():
    core = Relayed()
    core.planned()
    core.direct_votes()  # at t=0: the vote timeout runs from here
    core.send(21, rm.group_vote(1, True, [3, 4, 5], "", 3.0, 30))
    assert core.feed(co.Tick(), at=G - 0.01) == []
    (decision,) = decisions(core.feed(co.Tick(), at=G))
    assert decision.outcome == rpb.StepDecision.RETRY
    assert "3 rank(s) did not vote within" in decision.reason and "6, 7, 8" in decision.reason


def test_a_dead_relay_retries_the_attempt_and_fails_the_replica_naming_its_group():
    core = Relayed()
    core.planned()
    core.direct_votes()
    effects = core.feed(co.ConnectionLost(22, "connection reset"))
    (decision,) = decisions(effects)
    assert decision.outcome == rpb.StepDecision.RETRY
    assert "ranks 6..8 left the replica: their relay (rank 6) is gone: connection reset" in decision.reason
    assert core.c.stage is co.Stage.FAILED and any(isinstance(e, co.ReportFailure) and e.dead for e in effects)
    assert 22 not in core.c.links() and not {6, 7, 8} & set(core.c.conn_of)


def test_a_rank_leaving_its_relay_fails_the_replica_as_a_direct_rank_would():
    core = Relayed()
    core.planned()
    effects = core.send(21, rm.rank_left(5, "closed the connection"))
    assert decisions(effects)[0].reason == "rank 5 left the replica: closed the connection"
    assert core.c.stage is co.Stage.FAILED


@pytest.mark.parametrize("frame", [
    rm.group_vote(1, True, [3, 4, 6]),                                  # 6 is group 2's
    rm.group_vote(1, False, [0], "no"),                                  # 0 talks to the coordinator itself
    rm.group_begin(5, [2, 3]),
    rm.group_digests(1, 5, [(3, bytes(32)), (9, bytes(32))]),          # 9 is nobody's
    rm.relayed(7, msg.close(5, "bye")),
    rm.rank_left(8, "gone"),
])
def test_a_group_message_naming_a_rank_outside_its_group_is_refused_and_changes_nothing(frame):
    core = Relayed()
    core.planned()
    core.direct_votes()
    before = copy.deepcopy(core.snapshot())
    (refuse,) = core.send(21, frame)
    assert isinstance(refuse, co.Refuse) and refuse.conn == 21 and "outside its group" in refuse.reason
    assert "ranks 3..5" in refuse.reason and core.snapshot() == before


def test_relay_hellos_that_do_not_fit_the_tree_are_refused():
    core = Relayed(hellos=False)
    for frame, reason in [
        (rm.relay_hello(1, 4, 9, "j", "b", "h:1", "i"), "groups of 4; this replica has 9 ranks in groups of 3"),
        (rm.relay_hello(3, 3, 9, "j", "b", "h:1", "i"), "group 3; this replica's relays serve groups 1..2"),
        (rm.relay_hello(1, 3, 9, "j", "other", "h:1", "i"), "replica 'other'"),
    ]:
        (refuse,) = core.send(30, frame)
        assert isinstance(refuse, co.Refuse) and reason in refuse.reason, refuse
    assert core.c.link_group == {} and core.send(21, rm.relay_hello(1, 3, 9, "j", "b", "h:1", "i")) == []
    (refuse,) = core.send(31, rm.relay_hello(1, 3, 9, "j", "b", "h:2", "i"))
    assert "the relay of group 1 is already connected" in refuse.reason and core.c.relay_links[1] == (21, "h:1")


def test_a_rank_behind_a_relay_cannot_say_hello_directly_and_a_refused_relayed_hello_goes_to_that_rank():
    core = Relayed(hellos=False)
    (refuse,) = core.send(10, hello(4))
    assert "rank 4 talks to the coordinator through its relay (rank 3)" in refuse.reason and 4 not in core.c.conn_of
    core.send(21, rm.relay_hello(1, 3, 9, "j", "b", "h:1", "i"))
    assert core.send(21, rm.relayed(4, hello(4))) == []
    (send,) = core.send(21, rm.relayed(4, hello(4)))  # a second process claims rank 4
    assert isinstance(send, co.SendTo) and send.conn == 21
    ((rank, kind, body),) = rm.decode_to_ranks(send.frame.to_ranks)
    assert (rank, kind) == (4, "refusal") and "rank 4 is already connected" in rpb.CoordinatorFrame.FromString(
        body).refusal.reason
    assert core.c.conn_of == {4: 21} and 21 in core.c.link_group  # the relay itself is kept


def test_a_group_closing_after_the_others_finishes_the_replica():
    core = Relayed()
    for rank in range(3):
        core.send(10 + rank, msg.close(0, "done"))
    for rank in range(3, 8):
        assert core.send(LINKS[rank // 3], rm.relayed(rank, msg.close(0, "done"))) == []
    (report,) = core.send(22, rm.relayed(8, msg.close(0, "done")))
    assert isinstance(report, co.ReportFinished) and core.c.stage is co.Stage.REPORTING
    (final,) = core.feed(co.FinishReported())
    assert final.frame.finished.clean and core.c.links() == [10, 11, 12, 21, 22]


def test_at_8192_ranks_a_round_is_about_two_sqrt_n_messages_each_way():
    big = dataclasses.replace(SETTINGS, world_size=8192, digest_every_steps=0).validate()
    tree = big.relay_tree()
    assert (tree.fanout, len(tree.relays)) == (91, 90)
    core = Core(big, hello=False)
    link = {g: 1000 + g for g in range(1, tree.groups)}
    for g, conn in link.items():
        core.send(conn, rm.relay_hello(g, 91, 8192, "j", "b", f"h:{g}", "i"))
    for rank in range(8192):
        g = tree.group_of(rank)
        frame = msg.hello(rank, 8192, "j", "b", f"f{rank}", f"s{rank}", "i")
        assert core.send(link[g], rm.relayed(rank, frame)) == [] if g else core.send(10 + rank, frame) == []
    assert core.c.stage is co.Stage.READY and len(core.c.links()) == 91 + 90
    messages_in = 0
    for rank in tree.members(0):
        messages_in += 1
        effects = core.send(10 + rank, msg.begin(0))
    for g, conn in link.items():
        messages_in += 1
        effects = core.send(conn, rm.group_begin(0, tree.members(g)))
    (request,) = effects
    assert len(request.ftar_addresses) == 8192
    (plan,) = core.feed(co.QuorumAnswered(answer(max_step=0, members=MEMBERS, recover=(), addresses=False)))
    assert isinstance(plan, co.Broadcast)  # written once per link: 181 writes
    for rank in tree.members(0):
        messages_in += 1
        effects = core.send(10 + rank, msg.vote(1, True, "", 1.0, 1))
    for g, conn in link.items():
        messages_in += 1
        effects = core.send(conn, rm.group_vote(1, True, tree.members(g), "", 91.0, 91))
    (decision,) = decisions(effects)
    assert decision.outcome == rpb.StepDecision.COMMIT and messages_in == 2 * (91 + 90)

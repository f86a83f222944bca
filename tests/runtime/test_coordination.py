"""The replica coordinator's pure core: hellos, rounds, votes, digests, finishing, every timeout."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from fthsdp.step import coordination as co
from fthsdp.step import messages as msg
from protos import replica_pb2 as rpb
from tests.runtime.protocol_helpers import SETTINGS, answer

S = dataclasses.replace(SETTINGS, world_size=3, digest_every_steps=0)
G = S.gather_timeout_s


class Core:
    """A Coordination with three connected ranks (connections 10, 11, 12 are ranks 0, 1, 2)."""

    def __init__(self, settings=S, hello: bool = True) -> None:
        self.c = co.Coordination(settings, now=0.0)
        self.now = 0.0
        if hello:
            for rank in range(settings.world_size):
                assert self.send(10 + rank, msg.hello(rank, settings.world_size, "j", "b", f"f{rank}", f"s{rank}", "i"),
                                 ) == []

    def send(self, conn: int, frame: rpb.RankFrame, at: float | None = None) -> list:
        kind = frame.WhichOneof("body")
        return self.feed(co.FromRank(conn, kind, getattr(frame, kind)), at)

    def feed(self, event, at: float | None = None) -> list:
        if at is not None:
            self.now = at
        return self.c.advance(event, self.now)

    def begin_all(self, step: int = 5) -> list:
        effects = []
        for rank in range(self.c.world):
            effects += self.send(10 + rank, msg.begin(step))
        return effects

    def planned(self, step: int = 5, **kw) -> list:
        (request,) = self.begin_all(step)
        assert isinstance(request, co.RequestQuorum)
        kw = {"max_step": step, "members": (("a", step, True), ("b", step, True)), "recover": (), **kw}
        return self.feed(co.QuorumAnswered(answer(**kw)))


def frames(effects, kind: str) -> list:
    sent = [f for e in effects if isinstance(e, co.SendEach) for _, f in e.frames]
    sent += [e.frame for e in effects if isinstance(e, (co.Broadcast, co.SendTo))]
    return [getattr(f, kind) for f in sent if f.WhichOneof("body") == kind]


# ---------------------------------------------------------------- hellos


@pytest.mark.parametrize("hello, refusal", [
    (msg.hello(3, 3, "j", "b", "f", "s", "i"), "hello from rank 3 of world_size 3"),
    (msg.hello(1, 4, "j", "b", "f", "s", "i"), "world_size 4"),
    (msg.hello(1, 3, "j", "other", "f", "s", "i"), "replica 'other'"),
    (msg.hello(1, 3, "other", "b", "f", "s", "i"), "job 'other'"),
])
def test_bad_hellos_are_refused_and_change_nothing(hello, refusal):
    core = Core(hello=False)
    (refuse,) = core.send(20, hello)
    assert isinstance(refuse, co.Refuse) and refuse.conn == 20 and refusal in refuse.reason
    assert core.c.rank_of == {} and core.c.stage is co.Stage.CONNECTING


def test_a_duplicate_rank_is_refused_and_the_first_connection_keeps_it():
    core = Core(hello=False)
    assert core.send(20, msg.hello(1, 3, "j", "b", "f", "s", "i")) == []
    (refuse,) = core.send(21, msg.hello(1, 3, "j", "b", "f2", "s2", "i2"))
    assert "rank 1 is already connected" in refuse.reason and core.c.conn_of == {1: 20}
    (refuse,) = core.send(20, msg.hello(2, 3, "j", "b", "f", "s", "i"))
    assert "said hello twice" in refuse.reason and core.c.rank_of == {20: 1}


def test_a_message_before_hello_is_refused():
    core = Core(hello=False)
    (refuse,) = core.send(20, msg.vote(1, True, "", 0.0, 0))
    assert isinstance(refuse, co.Refuse) and "before this connection's hello" in refuse.reason


def test_a_hello_after_the_start_is_refused():
    core = Core()
    core.feed(co.ConnectionLost(12, "reset"))
    (refuse,) = core.send(30, msg.hello(2, 3, "j", "b", "f", "s", "i"))
    assert "cannot rejoin a running replica" in refuse.reason


def test_ranks_that_never_connect_fail_the_replica_after_the_quorum_timeout():
    core = Core(hello=False)
    core.send(10, msg.hello(0, 3, "j", "b", "f", "s", "i"))
    assert core.feed(co.Tick(), at=S.quorum_timeout_s - 0.01) == []
    effects = core.feed(co.Tick(), at=S.quorum_timeout_s)
    assert core.c.stage is co.Stage.FAILED and "missing 1, 2" in frames(effects, "no_plan")[0].reason


# ---------------------------------------------------------------- rounds


def test_the_quorum_is_requested_once_every_rank_began_with_every_address():
    core = Core()
    assert core.send(10, msg.begin(5)) == [] and core.send(11, msg.begin(5)) == []
    (request,) = core.send(12, msg.begin(5))
    assert request == co.RequestQuorum(5, 0, ("f0", "f1", "f2"), ("s0", "s1", "s2"))


def test_ranks_that_disagree_on_their_step_fail_the_replica():
    core = Core()
    core.send(10, msg.begin(5))
    core.send(11, msg.begin(5))
    effects = core.send(12, msg.begin(6))
    assert core.c.stage is co.Stage.FAILED and "disagree on their step" in frames(effects, "no_plan")[0].reason
    assert any(isinstance(e, co.ReportFailure) and e.dead for e in effects)


def test_a_slow_rank_makes_the_waiting_ranks_retry_after_the_gather_timeout():
    core = Core()
    core.send(10, msg.begin(5), at=1.0)
    core.send(11, msg.begin(5))
    assert core.feed(co.Tick(), at=1.0 + G - 0.01) == []
    (b,) = core.feed(co.Tick(), at=1.0 + G)
    assert b.frame.no_plan.kind == rpb.NoPlan.RETRY and "ranks 2 did not begin step 5" in b.frame.no_plan.reason
    assert core.c.begins == {}


def test_a_new_quorum_reaches_each_rank_with_its_own_address_column():
    core = Core(dataclasses.replace(S, world_size=2))
    (each,) = core.planned()
    assert isinstance(each, co.SendEach) and [conn for conn, _ in each.frames] == [10, 11]
    plans = frames([each], "plan")
    full = answer(max_step=5, members=(("a", 5, True), ("b", 5, True)), recover=())
    for k, plan in enumerate(plans):
        assert (plan.attempt, plan.step, list(plan.peers.replica_ids)) == (1, 5, ["a", "b"])
        assert list(plan.peers.ftar_addresses) == [f"fa{k}", f"fb{k}"]  # rank k's column only
        assert plan.quorum.quorum_id == 9 and not any(m.ftar_addresses for m in plan.quorum.members)
        assert [(m.replica_id, m.step, m.healthy) for m in plan.quorum.members] == \
            [(m.replica_id, m.step, m.healthy) for m in full.members]
    assert core.c.relayed_quorum_id == 9  # the ranks hold quorum 9's addresses now


def test_a_known_quorum_is_one_frame_for_every_rank():
    core = Core()
    core.planned()
    for rank in range(3):
        vote(core, rank)
    (request,) = core.begin_all(6)
    assert request.known_quorum_id == 9  # so the controller leaves the addresses out
    (broadcast,) = core.feed(co.QuorumAnswered(answer(max_step=6, addresses=False, recover=())))
    assert isinstance(broadcast, co.Broadcast) and not broadcast.frame.plan.HasField("peers")


def test_repeated_begins_of_the_round_in_flight_are_ignored():
    core = Core()
    core.begin_all()
    assert core.send(11, msg.begin(5)) == []
    core.feed(co.QuorumAnswered(answer()))
    assert core.send(11, msg.begin(5)) == [] and core.c.stage is co.Stage.VOTING


@pytest.mark.parametrize("kind, stage", [(co.QuorumRefusal.RETRY, co.Stage.READY),
                                         (co.QuorumRefusal.FINISHED, co.Stage.FINISHING),
                                         (co.QuorumRefusal.FATAL, co.Stage.FAILED)])
def test_a_failed_quorum_answers_every_begin(kind, stage):
    core = Core()
    core.begin_all()
    effects = core.feed(co.QuorumFailed(kind, "the job is COMPLETED"))
    (no_plan,) = frames(effects, "no_plan")
    assert no_plan.kind == kind.value and core.c.stage is stage


# ---------------------------------------------------------------- votes


def vote(core: Core, rank: int, ok: bool = True, attempt: int = 1, reason: str = "", loss: float = 1.0,
         at: float | None = None):
    return core.send(10 + rank, msg.vote(attempt, ok, reason, loss, 10), at)


def test_all_yes_commits_and_reports_the_step():
    core = Core()
    core.planned(step=5)
    assert vote(core, 0, loss=1.0) == [] and vote(core, 1, loss=2.0) == []
    effects = vote(core, 2, loss=3.0)
    (decision,) = frames(effects, "decision")
    assert (decision.outcome, decision.step, decision.quorum_id) == (rpb.StepDecision.COMMIT, 5, 9)
    (report,) = [e for e in effects if isinstance(e, co.ReportStep)]
    assert (report.step, report.loss, report.tokens, report.digest, report.caught_up) == (5, 2.0, 30, "", False)
    assert core.c.stage is co.Stage.READY and core.c.last_committed == 5


def test_one_no_decides_retry_at_once_and_later_votes_are_ignored():
    core = Core()
    core.planned()
    vote(core, 0)
    effects = vote(core, 1, ok=False, reason="FTAR peer died")
    (decision,) = frames(effects, "decision")
    assert decision.outcome == rpb.StepDecision.RETRY and "rank 1 voted no: FTAR peer died" in decision.reason
    assert any(isinstance(e, co.ReportFailure) and not e.dead for e in effects)
    assert vote(core, 2) == []


def test_a_rank_votes_once_and_only_for_the_current_attempt():
    core = Core()
    core.planned()
    vote(core, 0)
    assert vote(core, 0, ok=False) == []  # a second vote from the same rank does not count
    assert vote(core, 1, attempt=7) == []  # another attempt
    assert core.c.round.voted == {0}


def test_silent_ranks_retry_the_gather_timeout_after_the_first_vote():
    core = Core()
    core.planned()
    vote(core, 1, at=3.0)
    assert core.feed(co.Tick(), at=3.0 + G - 0.01) == []
    effects = core.feed(co.Tick(), at=3.0 + G)
    (decision,) = frames(effects, "decision")
    assert "2 rank(s) did not vote within 10s: 0, 2" in decision.reason


def test_a_rank_that_leaves_mid_vote_retries_the_attempt_and_fails_the_replica():
    core = Core()
    core.planned()
    vote(core, 0)
    effects = core.feed(co.ConnectionLost(12, "reset"))
    assert frames(effects, "decision")[0].outcome == rpb.StepDecision.RETRY
    assert frames(effects, "no_plan")[0].kind == rpb.NoPlan.FATAL and core.c.stage is co.Stage.FAILED
    (answer_,) = core.send(10, msg.begin(5))
    assert answer_.frame.no_plan.kind == rpb.NoPlan.FATAL  # later begins get the same answer


def test_stale_begins_after_a_commit_are_dropped():
    core = Core()
    core.planned(step=5)
    for rank in range(3):
        vote(core, rank)
    assert core.send(10, msg.begin(5)) == []  # step 5 is decided
    assert core.c.begins == {}


# ---------------------------------------------------------------- digests


def test_digests_are_combined_in_rank_order_and_reported_with_the_step():
    core = Core(dataclasses.replace(S, digest_every_steps=6))
    core.planned(step=5)
    for rank in range(3):
        vote(core, rank)
    assert core.c.stage is co.Stage.DIGESTS
    digests = [bytes([r]) * 32 for r in range(3)]
    assert core.send(12, msg.digest(1, 5, digests[2])) == []
    assert core.send(10, msg.digest(1, 4, digests[0])) == []  # another step: ignored
    core.send(10, msg.digest(1, 5, digests[0]))
    core.send(11, msg.begin(6))  # a rank that already moved on: kept for the next round
    effects = core.send(11, msg.digest(1, 5, digests[1]))
    (report,) = effects
    assert report.digest == hashlib.sha256(b"".join(digests)).hexdigest() and core.c.begins == {1: 6}
    # each rank's own digest goes with it (shortened), so the controller can name a corrupt rank's host
    assert report.rank_digests == tuple(d[:16].hex() for d in digests)


def test_a_caught_up_replica_reports_caught_up_with_its_digest():
    core = Core()
    core.planned(step=5, members=(("a", 5, True), ("b", 0, False)), recover=(("b", ("a",)),))
    for rank in range(3):
        vote(core, rank)
    for rank in range(3):
        effects = core.send(10 + rank, msg.digest(1, 5, b"\x01" * 32))
    (report,) = effects
    assert report.caught_up and report.step == 5 and report.digest


def test_missing_digests_report_the_step_without_one():
    core = Core(dataclasses.replace(S, digest_every_steps=6))
    core.planned(step=5)
    for rank in range(3):
        vote(core, rank, at=2.0)
    core.send(10, msg.digest(1, 5, b"\x01" * 32))
    (report,) = core.feed(co.Tick(), at=2.0 + G)
    assert report.digest == "" and "no digest from ranks 1, 2" in report.note and report.rank_digests == ()


# ---------------------------------------------------------------- finishing


def test_finish_reports_once_every_rank_closed_then_sends_the_last_word():
    core = Core()
    for rank in range(3):
        vote_step = core.send(10 + rank, msg.close(6, "loop ended"))
        if rank < 2:
            assert vote_step == [] or all(not isinstance(e, co.ReportFinished) for e in vote_step)
    assert core.c.stage is co.Stage.REPORTING
    (b,) = core.feed(co.FinishReported("COMPLETED"))
    assert b.frame.finished.clean and b.frame.finished.step == 5 and core.c.stage is co.Stage.FINISHED


def test_a_close_mid_vote_retries_and_later_begins_hear_finished():
    core = Core()
    core.planned()
    vote(core, 0)
    effects = core.send(11, msg.close(5, "interrupted"))
    assert frames(effects, "decision")[0].outcome == rpb.StepDecision.RETRY
    (answer_,) = core.send(10, msg.begin(5))
    assert answer_.frame.no_plan.kind == rpb.NoPlan.FINISHED


def test_a_finished_job_lets_the_ranks_close():
    core = Core()
    core.begin_all()
    core.feed(co.QuorumFailed(co.QuorumRefusal.FINISHED, "job COMPLETED"))
    assert core.c.next_deadline() == co.INF  # nobody waits until a rank closes
    for rank in range(3):
        effects = core.send(10 + rank, msg.close(5, "loop ended"))
    assert effects == [co.ReportFinished(4, "job COMPLETED")]


def test_ranks_that_never_close_end_the_wait_uncleanly():
    core = Core()
    core.send(10, msg.close(5, "done"), at=1.0)
    (b,) = core.feed(co.Tick(), at=1.0 + G)
    assert not b.frame.finished.clean and "ranks 1, 2 did not close" in b.frame.finished.reason


def test_an_event_the_core_cannot_take_raises():
    core = Core()
    with pytest.raises(co.ProtocolError, match="quorum answer|QuorumAnswered"):
        core.feed(co.QuorumAnswered(answer()))
    with pytest.raises(co.ProtocolError, match="finish report"):
        core.feed(co.FinishReported())

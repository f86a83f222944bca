"""The replica's coordinator, as a sans-I/O state machine: one `advance(event, now)` entry point.

Rank 0 hosts it (fthsdp/step/coordinator.py does the sockets and the controller calls);
every rank, rank 0 included, is its client -- directly, or in a large replica through its
group's relay, whose messages count for all of the group's ranks (fthsdp/step/relay_links.py).
One round per step attempt:

    CONNECTING ──every rank said hello──▶ READY ──every rank began step s──▶ QUORUM
        ▲                                   ▲ ▲                                 │ answer: plan to all
        │                                   │ └───── a rollback answer offers a newer checkpoint:
        │                                   │        every rank loads it (no vote, no report)
        │                                   │ report step (with digest)          ▼
        │                                DIGESTS ◀──commit, digest due── VOTING ──commit──▶ READY
        │                                                                 │ a no, a silent rank
        │                                                                 └──retry──▶ READY
    FINISHING ◀── a rank closed, or the job is COMPLETED     FAILED ◀── a rank left, ranks disagree
        │ every rank closed: ReportFinished
        ▼
    REPORTING ──reported──▶ FINISHED (finished to all)

Rules that keep every rank of the replica on the same outcome:
- a connection is bound to the rank of its hello; a second hello, an unknown, duplicate or
  out-of-range rank, or a message before the hello is refused (that connection only);
- one decision per attempt, sent to every rank: COMMIT only when every rank voted yes on
  it; a no, a silent rank (`gather_timeout_s` after the first vote), a rank that closed or
  left makes it RETRY; later votes on a decided attempt are ignored;
- every begin gets exactly one answer (plan or no_plan), numbered like decisions, so a rank
  can tell a late message from the answer it waits for;
- the plan is the controller's answer, one frame for every rank, except when the quorum's
  addresses are new: then each rank gets its own column of them with it;
- a rollback answer whose `resume_checkpoint_step` is newer than the replica's state is a
  resume order when this replica has a checkpoint directory (the ranks load that checkpoint
  and begin its step); otherwise the field is removed and the ranks train the answer's step.

Step reports carry the newest checkpoint rank 0 saved (CheckpointSaved), so the controller
can offer it when a rollback would go back further.

Unlike the rank protocol, this object keeps its state in place: its events are per rank
(8,192 votes per step), and copying the tallies for each would cost O(ranks²) per step.
An event it cannot take raises ProtocolError before changing anything.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from fthsdp.settings import RuntimeSettings
from fthsdp.step.coordination_types import (INF, Broadcast, CheckpointSaved, ConnectionLost, Effect, Event,  # noqa: F401
                                            FinishReported, FromRank, ProtocolError, QuorumAnswered, QuorumFailed,
                                            QuorumRefusal, Refuse, ReportFailure, ReportFinished, ReportStep,
                                            RequestQuorum, SendEach, SendTo, Stage, Tick)
from fthsdp.step.messages import clip
from fthsdp.step.plan import address_columns, digest_due, without_addresses
from fthsdp.step.relay_links import RelayLinks
from fthsdp.step.relay_messages import to_ranks
from protos import controller_pb2 as pb
from protos import replica_pb2 as rpb

#: bytes of each rank's digest sent with a replica digest (hex: twice as many characters)
RANK_DIGEST_BYTES = 16


@dataclass
class _Round:
    """What the coordinator knows of the current attempt."""
    step: int = -1                  # the step the ranks began (the replica's committed state)
    trained: int = -1               # the step trained: the answer's max_step (> step when behind)
    started_at: float = 0.0
    answer: pb.QuorumResponse | None = None
    voted: set[int] = field(default_factory=set)
    vote_deadline: float = INF
    loss_sum: float = 0.0
    tokens: int = 0
    digests: dict[int, bytes] = field(default_factory=dict)
    digest_deadline: float = INF
    behind: bool = False
    decided_at: float = 0.0


class Coordination(RelayLinks):
    def __init__(self, settings: RuntimeSettings, now: float) -> None:
        self.settings = settings
        self.world = settings.world_size
        self.tree = settings.relay_tree()
        self.stage = Stage.CONNECTING
        self.hello_deadline = now + settings.quorum_timeout_s
        self.rank_of: dict[int, int] = {}          # a rank's own connection -> rank
        self.conn_of: dict[int, int] = {}          # rank -> its connection, or its relay's
        self.link_group: dict[int, int] = {}       # a relay's connection -> its group
        self.relay_links: dict[int, tuple[int, str]] = {}  # group -> its relay's (connection, address)
        self.link_ranks: dict[int, set[int]] = {}  # a relay's connection -> the ranks bound to it
        self.addresses: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # every rank's FTAR, state address
        self.hellos: dict[int, rpb.RankHello] = {}  # rank -> its hello
        self.begins: dict[int, int] = {}            # rank -> step, for the next round
        self.begins_kept_after = -1                 # the last_committed the begins were last filtered for
        self.begin_deadline = INF
        self.closes: dict[int, int] = {}            # rank -> its step when it closed
        self.close_deadline = INF
        self.attempt = 0
        self.round = _Round()
        self.last_committed = -1
        self.relayed_quorum_id = 0                  # the last quorum whose addresses every rank got
        self.checkpoint_step = -1                   # the newest checkpoint rank 0 saved (committed step)
        self.reason = ""                            # why FINISHING / FAILED

    # ------------------------------------------------------------ entry point

    def advance(self, event: Event, now: float) -> list[Effect]:
        if isinstance(event, FromRank):
            return self._from_rank(event, now)
        if isinstance(event, Tick):
            return self._tick(now)
        if isinstance(event, ConnectionLost):
            return self._lost(event, now)
        if isinstance(event, (QuorumAnswered, QuorumFailed)):
            self._expect(*_AFTER_REQUEST, what=f"a {type(event).__name__}")
            if self.stage is not Stage.QUORUM:
                return []  # the replica finished or failed while the request was out: answered then
            if isinstance(event, QuorumAnswered):
                return self._answered(event.answer, now)
            return self._quorum_failed(event, now)
        if isinstance(event, CheckpointSaved):
            self.checkpoint_step = max(self.checkpoint_step, event.step)
            return []
        if isinstance(event, FinishReported):
            self._expect(Stage.REPORTING, what="a finish report")
            self.stage = Stage.FINISHED
            return [Broadcast(_finished(self._finish_step(), True, self.reason))]
        raise ProtocolError(f"the coordinator cannot take a {type(event).__name__}")

    def next_deadline(self) -> float:
        """When a Tick can next change something."""
        if self.stage is Stage.CONNECTING:
            return self.hello_deadline
        if self.stage is Stage.READY:
            return self.begin_deadline
        if self.stage is Stage.VOTING:
            return self.round.vote_deadline
        if self.stage is Stage.DIGESTS:
            return self.round.digest_deadline
        if self.stage is Stage.FINISHING:
            return self.close_deadline
        return INF

    def _expect(self, *stages: Stage, what: str) -> None:
        if self.stage not in stages:
            raise ProtocolError(f"the coordinator got {what} while {self.stage.name}")

    # ------------------------------------------------------------ rank messages

    def _from_rank(self, ev: FromRank, now: float) -> list[Effect]:
        if ev.conn in self.link_group:
            return self._from_relay(ev, now)
        if ev.kind == "relay_hello":
            return self._relay_hello(ev.conn, ev.message)
        if ev.kind == "hello":
            return self._hello(ev.conn, ev.message, now)
        rank = self.rank_of.get(ev.conn)
        if rank is None:
            return [Refuse(ev.conn, f"a {ev.kind} before this connection's hello")]
        handler = {"begin": self._begin, "vote": self._vote, "digest": self._digest, "close": self._close}.get(ev.kind)
        if handler is None:
            raise ProtocolError(f"the coordinator cannot take a {ev.kind!r} frame")
        return handler(rank, ev.message, now)

    def _hello(self, conn: int, h: rpb.RankHello, now: float, relayed: bool = False) -> list[Effect]:
        """A rank's hello on its own connection, or through its relay's (`relayed`)."""
        s = self.settings

        def refuse(reason: str) -> list[Effect]:
            if relayed:
                return [SendTo(conn, to_ranks([(h.rank, rpb.CoordinatorFrame(refusal=rpb.Refusal(reason=clip(reason))))]))]
            return [Refuse(conn, reason)]
        if conn in self.rank_of:
            return refuse(f"rank {self.rank_of[conn]} said hello twice on one connection")
        if h.world_size != self.world or not 0 <= h.rank < self.world:
            return refuse(f"hello from rank {h.rank} of world_size {h.world_size}; this replica has "
                          f"ranks 0..{self.world - 1}")
        if (h.job_id, h.replica_id) != (s.job_id, s.replica_id):
            return refuse(f"hello for job {h.job_id!r} replica {h.replica_id!r}; this coordinator serves "
                          f"job {s.job_id!r} replica {s.replica_id!r}")
        if not relayed and self.tree.upstream(h.rank) is not None:
            return refuse(f"rank {h.rank} talks to the coordinator through its relay (rank "
                          f"{self.tree.upstream(h.rank)}), not directly")
        if h.rank in self.conn_of:
            return refuse(f"rank {h.rank} is already connected (a second process claims it)")
        if self.stage is not Stage.CONNECTING or h.rank in self.hellos:
            return refuse(f"rank {h.rank} said hello after the replica started; a rank cannot rejoin a "
                          f"running replica: restart the whole replica")
        if relayed:
            self.link_ranks[conn].add(h.rank)
        else:
            self.rank_of[conn] = h.rank
        self.conn_of[h.rank], self.hellos[h.rank] = conn, h
        if len(self.hellos) < self.world:
            return []
        self.stage = Stage.READY
        ranks = range(self.world)  # fixed from now on: every quorum request names them
        self.addresses = (tuple(self.hellos[k].ftar_address for k in ranks),
                          tuple(self.hellos[k].state_address for k in ranks))
        return self._maybe_start_round(now)

    def _begin(self, rank: int, msg: rpb.BeginStep, now: float) -> list[Effect]:
        return self._begin_ranks([rank], msg.step, lambda frame: self._send(rank, frame), now)

    def _begin_ranks(self, ranks: list[int], step: int, answer, now: float) -> list[Effect]:
        """`ranks` began `step` (a rank's begin, or its relay's for several); `answer(frame)` is
        the effect that sends them all one frame."""
        if step <= self.last_committed:
            return []  # late: that step is decided
        if self.stage in (Stage.FINISHING, Stage.REPORTING, Stage.FINISHED):
            return [answer(self._no_plan(step, QuorumRefusal.FINISHED, self.reason))]
        if self.stage is Stage.FAILED:
            return [answer(self._no_plan(step, QuorumRefusal.FATAL, self.reason))]
        if self.stage in (Stage.QUORUM, Stage.VOTING) and step == self.round.step:
            return []  # a repeated begin of the round in flight
        if not self.begins:
            self.begin_deadline = now + self.settings.gather_timeout_s
        self.begins.update(dict.fromkeys(ranks, step))
        return self._maybe_start_round(now)

    def _vote(self, rank: int, msg: rpb.StepVote, now: float) -> list[Effect]:
        return self._count_votes([rank], msg.attempt, msg.ok, f"rank {rank} voted no: {msg.reason or 'no reason given'}",
                                 msg.loss, msg.tokens, now)

    def _count_votes(self, ranks: list[int], attempt: int, ok: bool, no_reason: str, loss: float, tokens: int,
                     now: float) -> list[Effect]:
        """The votes of `ranks` (a rank's, or its relay's for several): yes with their summed loss
        and tokens, or a no for `no_reason`."""
        r = self.round
        fresh = ranks if r.voted.isdisjoint(ranks) else [k for k in ranks if k not in r.voted]
        if self.stage is not Stage.VOTING or attempt != self.attempt or not fresh:
            return []  # late, duplicated or for another attempt
        if not r.voted:
            r.vote_deadline = now + self.settings.gather_timeout_s
        r.voted.update(fresh)
        r.loss_sum += loss
        r.tokens += tokens
        if not ok:
            return self._decide(False, no_reason, now)
        if len(r.voted) == self.world:
            return self._decide(True, f"all {self.world} ranks voted yes", now)
        return []

    def _digest(self, rank: int, msg: rpb.StateDigest, now: float) -> list[Effect]:
        r = self.round
        if self.stage is not Stage.DIGESTS or msg.attempt != self.attempt or msg.step != r.trained:
            return []
        r.digests.setdefault(rank, msg.sha256)
        return self._maybe_digests_done(now)

    def _maybe_digests_done(self, now: float) -> list[Effect]:
        r = self.round
        if len(r.digests) < self.world:
            return []
        combined = hashlib.sha256(b"".join(r.digests[k] for k in range(self.world))).hexdigest()
        ranks = tuple(r.digests[k][:RANK_DIGEST_BYTES].hex() for k in range(self.world))
        return self._report_commit(combined, "", now, ranks)

    def _close(self, rank: int, msg: rpb.CloseRank, now: float) -> list[Effect]:
        if self.stage is Stage.FAILED:
            return [self._send(rank, _finished(msg.step - 1, False, self.reason))]
        if rank in self.closes:
            return []
        if self.stage is Stage.FINISHED:  # it closes after the others gave up waiting for it
            self.closes[rank] = msg.step
            return [self._send(rank, _finished(self._finish_step(), False, self.reason))]
        if not self.closes:
            self.close_deadline = now + self.settings.gather_timeout_s
        self.closes[rank] = msg.step
        effects: list[Effect] = []
        if self.stage is Stage.VOTING:
            effects += self._decide(False, f"rank {rank} closed: {msg.reason}", now)
        if self.stage in (Stage.DIGESTS, Stage.FINISHING, Stage.REPORTING, Stage.FINISHED):
            return effects + self._maybe_finish(now)
        # CONNECTING, READY or QUORUM: no round can start or train any more
        return effects + self._start_finishing(f"rank {rank} closed: {msg.reason}", now)

    # ------------------------------------------------------------ rounds

    def _maybe_start_round(self, now: float) -> list[Effect]:
        if self.closes:
            return self._start_finishing(self.reason or "a rank closed", now)
        if self.stage is not Stage.READY:
            return []
        if self.begins_kept_after != self.last_committed:  # drop begins a commit made late (once per commit:
            self.begins = {r: st for r, st in self.begins.items() if st > self.last_committed}  # not per begin)
            self.begins_kept_after = self.last_committed
        if len(self.begins) < self.world:
            if not self.begins:
                self.begin_deadline = INF
            return []
        steps = set(self.begins.values())
        if len(steps) > 1:
            by_step = {st: sorted(r for r, x in self.begins.items() if x == st) for st in sorted(steps)}
            return self._fail(f"the replica's ranks disagree on their step: {by_step}", now)
        (step,) = steps
        self.stage = Stage.QUORUM
        self.round = _Round(step=step, started_at=now)
        self.begins, self.begin_deadline = {}, INF
        return [RequestQuorum(step, self.relayed_quorum_id, *self.addresses)]

    def _answered(self, answer: pb.QuorumResponse, now: float) -> list[Effect]:
        r = self.round
        self.attempt += 1
        resume = self._resume_step(answer)
        if resume is None and answer.HasField("resume_checkpoint_step"):
            kept = pb.QuorumResponse()
            kept.CopyFrom(answer)
            kept.ClearField("resume_checkpoint_step")  # the ranks train max_step from their own state
            answer = kept
        self.stage = Stage.VOTING
        r.answer, r.trained = answer, answer.max_step
        me = next((m for m in answer.members if m.replica_id == self.settings.replica_id), None)
        r.behind = me is not None and not me.healthy
        effects = self._plan_frames(answer)
        if resume is not None:
            # Every rank loads the checkpoint and begins its step: nothing is trained or reported
            # in this quorum, and begins of older steps are late from now on.
            self.stage, self.last_committed = Stage.READY, resume
            effects += self._maybe_start_round(now)
        return effects

    def _plan_frames(self, answer: pb.QuorumResponse) -> list[Effect]:
        r = self.round
        if not answer.addresses_included:  # the ranks hold this quorum's addresses: one frame for all
            return [Broadcast(rpb.CoordinatorFrame(plan=rpb.StepPlan(attempt=self.attempt, step=r.step,
                                                                     quorum=answer)))]
        self.relayed_quorum_id = answer.quorum_id
        bare = without_addresses(answer)
        return [SendEach(self._each((k, rpb.CoordinatorFrame(plan=rpb.StepPlan(
                    attempt=self.attempt, step=r.step, quorum=bare, peers=column)))
                for k, column in enumerate(address_columns(answer, self.world)) if k in self.conn_of))]

    def _resume_step(self, answer: pb.QuorumResponse) -> int | None:
        """The checkpoint (committed step) the ranks load instead of training, or None."""
        if not answer.HasField("resume_checkpoint_step"):
            return None
        offered = answer.resume_checkpoint_step
        if not self.settings.checkpoint_dir or offered + 1 <= self.round.step:
            return None  # no checkpoints here, or not newer than what the ranks hold
        return offered

    def _quorum_failed(self, ev: QuorumFailed, now: float) -> list[Effect]:
        step = self.round.step
        if ev.kind is QuorumRefusal.FATAL:
            return self._fail(ev.reason, now)
        if ev.kind is QuorumRefusal.FINISHED:
            self.reason = ev.reason
            self.stage = Stage.FINISHING
            self.close_deadline = INF  # ranks close when their loops end; the first close starts the clock
            return [Broadcast(self._no_plan(step, QuorumRefusal.FINISHED, ev.reason))]
        self.stage = Stage.READY
        return [Broadcast(self._no_plan(step, QuorumRefusal.RETRY, ev.reason))] + self._maybe_start_round(now)

    def _decide(self, commit: bool, reason: str, now: float) -> list[Effect]:
        r = self.round
        answer = r.answer
        assert answer is not None
        r.decided_at = now
        outcome = rpb.StepDecision.COMMIT if commit else rpb.StepDecision.RETRY
        effects: list[Effect] = [Broadcast(rpb.CoordinatorFrame(decision=rpb.StepDecision(
            attempt=self.attempt, quorum_id=answer.quorum_id, step=r.trained, outcome=outcome, reason=clip(reason))))]
        if not commit:
            self.stage = Stage.READY
            effects.append(ReportFailure(answer.quorum_id, r.trained, reason, dead=False))
            return effects + self._maybe_start_round(now)
        self.last_committed = r.trained
        if digest_due(answer, self.settings.replica_id, self.settings.digest_every_steps):
            self.stage = Stage.DIGESTS
            r.digest_deadline = now + self.settings.gather_timeout_s
            return effects
        return effects + self._report_commit("", "", now)

    def _report_commit(self, digest: str, note: str, now: float, rank_digests: tuple[str, ...] = ()) -> list[Effect]:
        r = self.round
        assert r.answer is not None
        loss = r.loss_sum / max(len(r.voted), 1)
        saved = self.checkpoint_step if 0 <= self.checkpoint_step <= r.trained else None
        report = ReportStep(r.answer.quorum_id, r.trained, r.decided_at - r.started_at, loss, r.tokens, digest,
                            r.behind, note, rank_digests, saved)
        self.stage = Stage.READY
        return [report] + self._maybe_start_round(now)

    def _start_finishing(self, reason: str, now: float) -> list[Effect]:
        self.reason = self.reason or reason
        answer_begins = bool(self.begins) or self.stage is Stage.QUORUM
        self.stage = Stage.FINISHING
        self.begins, self.begin_deadline = {}, INF
        effects: list[Effect] = []
        if answer_begins:  # ranks waiting for a plan get their answer now
            effects.append(Broadcast(self._no_plan(self.round.step, QuorumRefusal.FINISHED, self.reason)))
        return effects + self._maybe_finish(now)

    def _maybe_finish(self, now: float) -> list[Effect]:
        if self.stage is Stage.DIGESTS or len(self.closes) < self.world:
            return []
        if self.stage in (Stage.REPORTING, Stage.FINISHED):
            return []
        self.stage = Stage.REPORTING
        self.close_deadline = INF
        return [ReportFinished(self._finish_step(), self.reason)]

    def _finish_step(self) -> int:
        """The last committed step: the lowest step a rank closed at, minus one."""
        return min(self.closes.values(), default=self.last_committed + 1) - 1

    def _fail(self, reason: str, now: float) -> list[Effect]:
        self.stage, self.reason = Stage.FAILED, reason
        self.begins, self.begin_deadline = {}, INF
        answer = self.round.answer
        quorum_id = answer.quorum_id if answer is not None else 0
        effects: list[Effect] = [Broadcast(self._no_plan(self.round.step, QuorumRefusal.FATAL, reason))]
        if self.closes:  # ranks already waiting for the last word get it now
            effects.append(Broadcast(_finished(self._finish_step(), False, reason)))
        return effects + [ReportFailure(quorum_id, max(self.round.step, 0), reason, dead=True)]

    # ------------------------------------------------------------ time and losses

    def _tick(self, now: float) -> list[Effect]:
        if now < self.next_deadline():
            return []
        g = self.settings.gather_timeout_s
        if self.stage is Stage.CONNECTING:
            missing = sorted(set(range(self.world)) - set(self.hellos))
            return self._fail(f"only {len(self.hellos)} of {self.world} ranks connected within "
                              f"{self.settings.quorum_timeout_s:g}s; missing {_ranks(missing)}", now)
        if self.stage is Stage.READY:
            missing = sorted(set(range(self.world)) - set(self.begins))
            step = max(self.begins.values())
            self.begins, self.begin_deadline = {}, INF
            return [Broadcast(self._no_plan(step, QuorumRefusal.RETRY,
                                            f"ranks {_ranks(missing)} did not begin step {step} within {g:g}s"))]
        if self.stage is Stage.VOTING:
            missing = sorted(set(range(self.world)) - self.round.voted)
            return self._decide(False, f"{len(missing)} rank(s) did not vote within {g:g}s: {_ranks(missing)}", now)
        if self.stage is Stage.DIGESTS:
            missing = sorted(set(range(self.world)) - set(self.round.digests))
            return self._report_commit("", f"no digest from ranks {_ranks(missing)} within {g:g}s", now)
        if self.stage is Stage.FINISHING:
            missing = sorted(set(range(self.world)) - set(self.closes))
            self.stage = Stage.FINISHED
            return [Broadcast(_finished(self._finish_step(), False,
                                        f"ranks {_ranks(missing)} did not close within {g:g}s"))]
        return []

    def _lost(self, ev: ConnectionLost, now: float) -> list[Effect]:
        if ev.conn in self.link_group:
            return self._link_lost(ev.conn, ev.reason, now)
        rank = self.rank_of.pop(ev.conn, None)
        if rank is None:
            return []
        self.conn_of.pop(rank, None)
        return self._departed([rank], f"rank {rank} left the replica: {ev.reason}", now)

    def _departed(self, ranks: list[int], reason: str, now: float) -> list[Effect]:
        """`ranks` are gone (their connection, or their relay's, broke): the attempt in flight is
        retried and the replica fails, unless they had closed or the replica is over."""
        if all(r in self.closes for r in ranks) or self.stage in (Stage.FINISHED, Stage.FAILED):
            return []
        effects: list[Effect] = []
        if self.stage is Stage.VOTING:
            effects += self._decide(False, reason, now)
        return effects + self._fail(reason, now)

    # ------------------------------------------------------------ helpers

    def links(self) -> list[int]:
        """The connections a broadcast is written to: every rank's own, and every relay's once."""
        return [*self.rank_of, *self.link_group]

    def _no_plan(self, step: int, kind: QuorumRefusal, reason: str) -> rpb.CoordinatorFrame:
        self.attempt += 1
        return rpb.CoordinatorFrame(no_plan=rpb.NoPlan(attempt=self.attempt, step=max(step, 0), kind=kind.value,
                                                       reason=clip(reason)))


_AFTER_REQUEST = (Stage.QUORUM, Stage.FINISHING, Stage.REPORTING, Stage.FINISHED, Stage.FAILED)


def _finished(step: int, clean: bool, reason: str) -> rpb.CoordinatorFrame:
    return rpb.CoordinatorFrame(finished=rpb.ReplicaFinished(step=max(step, -1), clean=clean, reason=clip(reason)))


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" ... ({len(ranks)} in all)" if len(ranks) > 8 else "")

"""Randomized: one replica's ranks and its coordinator, driven through random event orders.

Every frame travels through the real codec over a simulated network that drops, duplicates
and delays messages; fetches, reductions and quorum answers fail at random; ranks close at
random; time is a fake clock. Whatever happens, safety must hold:
- all ranks that concluded an attempt concluded it the same way (no rank commits an attempt
  another rank retries), and a rank commits only what the coordinator committed;
- the coordinator commits an attempt only when every rank's yes vote on it reached it
  (a naive reference over what it received);
- every live rank applied a prefix of the coordinator's commits (at most the last one
  missing: its decision may still be in flight), and ranks with the same commits hold the
  same step and ledger.
Liveness is allowed to suffer (a rank that lost its decision fails), safety never.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections import defaultdict

from fthsdp.data_ledger import DataLedger
from fthsdp.step import coordination as co
from fthsdp.step import events as ev
from fthsdp.step import messages as msg
from fthsdp.step import frames
from fthsdp.step.plan import AddressBook
from fthsdp.step.protocol import Phase, advance, initial_state
from protos import controller_pb2 as pb
from protos import replica_pb2 as rpb
from tests.runtime.protocol_helpers import SETTINGS


class World:
    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.world = rng.randint(1, 5)
        self.loss, self.dup = rng.choice([0.0, 0.02, 0.1]), rng.choice([0.0, 0.05, 0.2])
        self.settings = dataclasses.replace(SETTINGS, world_size=self.world, max_retries=rng.randint(1, 6),
                                            digest_every_steps=rng.choice([0, 2, 3]), gather_timeout_s=5.0, allreduce_timeout_s=5.0,
                                            quorum_timeout_s=5.0, fetch_timeout_s=2.0, fetch_attempts=1)
        self.now = 0.0
        self.queue: list = []
        self.seq = itertools.count()
        self.core = co.Coordination(self.settings, 0.0)
        self.ranks = {r: initial_state(dataclasses.replace(self.settings, rank=r), 0, DataLedger({"a": 0, "b": 0}))
                      for r in range(self.world)}
        self.books = {r: AddressBook() for r in range(self.world)}
        self.fetch_token = {r: 0 for r in range(self.world)}
        self.concluded: dict[int, dict[int, bool]] = defaultdict(dict)   # attempt -> rank -> committed
        self.commits: dict[int, list[int]] = defaultdict(list)           # rank -> committed attempts, in order
        self.decided: dict[int, bool] = {}                               # attempt -> coordinator's commit
        self.yes_seen: dict[int, set[int]] = defaultdict(set)            # attempt -> ranks whose yes arrived
        self.quorum_id = 1
        for r in range(self.world):  # connection r is rank r; hellos are the reliable set-up
            hello = msg.hello(r, self.world, "j", "b", f"f{r}", f"s{r}", "i")
            self._coordinator(co.FromRank(r, "hello", hello.hello))
        for r in range(self.world):
            self.later(self.rng.uniform(0, 1), ("user", r))

    # -- the scheduler

    def later(self, delay: float, item) -> None:
        heapq.heappush(self.queue, (self.now + delay, next(self.seq), item))

    def send(self, direction: str, item: tuple) -> None:
        """Over the lossy network: maybe dropped, maybe twice, each copy delayed (so reordered)."""
        if self.rng.random() < self.loss:
            return
        for _ in range(2 if self.rng.random() < self.dup else 1):
            self.later(self.rng.uniform(0.0, 0.5), (direction, *item))

    def run(self, until: float = 200.0) -> None:
        self.later(0.5, ("tick",))
        while self.now < until and any(st.phase not in (Phase.FINISHED, Phase.FAILED) for st in self.ranks.values()):
            self.now, _, item = heapq.heappop(self.queue)
            kind = item[0]
            if kind == "to_coordinator":
                kind_, body = msg.decode_rank_frame(item[2])
                if kind_ == "vote" and body.ok:
                    self.yes_seen[body.attempt].add(item[1])
                self._coordinator(co.FromRank(item[1], kind_, body))
            elif kind == "to_rank":
                self._rank(item[1], self._event_of(item[1], *msg.decode_coordinator_frame(item[2])))
            elif kind == "fetch_done":  # a cancelled fetch reports nothing
                _, r, token, result = item
                if token == self.fetch_token[r] and self.ranks[r].phase is Phase.TRAINING:
                    self._rank(r, result)
            elif kind == "coordinator_event":
                self._coordinator(item[1])
            elif kind == "user":
                self._user(item[1])
            elif kind == "tick":  # deadlines are checked every half second of fake time
                self._coordinator(co.Tick())
                for r in self.ranks:
                    self._rank(r, ev.Tick())
                self.later(0.5, ("tick",))

    # -- the ranks

    def _event_of(self, rank: int, kind: str, m) -> ev.Event:
        """The product's one translation (fthsdp/step/frames.py), with this rank's settings."""
        return frames.event_of(kind, m, self.books[rank], self.ranks[rank].settings)

    def _rank(self, r: int, event) -> None:
        state = self.ranks[r]
        if state.phase in (Phase.FAILED, Phase.FINISHED):
            return
        self.ranks[r], effects = advance(state, event, self.now)
        for e in effects:
            if isinstance(e, (ev.SendBegin, ev.SendVote, ev.SendDigest, ev.SendClose)):
                frame = {ev.SendBegin: lambda: msg.begin(e.step),
                         ev.SendVote: lambda: msg.vote(e.attempt, e.ok, e.reason, e.loss, e.tokens),
                         ev.SendDigest: lambda: msg.digest(e.attempt, e.step, bytes([r]) * 32),
                         ev.SendClose: lambda: msg.close(e.step, e.reason)}[type(e)]()
                self.send("to_coordinator", (r, msg.frame(frame)[4:]))
            elif isinstance(e, ev.StartFetch):
                self.fetch_token[r] += 1
                ok = self.rng.random() < 0.8
                result = ev.FetchFinished(ok, "" if ok else "injected", DataLedger({"a": e.plan.step, "b": 0}))
                self.later(self.rng.uniform(0.0, 3.0), ("fetch_done", r, self.fetch_token[r], result))
            elif isinstance(e, ev.CancelFetch):
                self.fetch_token[r] += 1
            elif isinstance(e, ev.Concluded):
                attempt = e.outcome.attempt
                assert r not in self.concluded[attempt], f"rank {r} concluded attempt {attempt} twice"
                self.concluded[attempt][r] = e.outcome.committed
                if e.outcome.committed:
                    self.commits[r].append(attempt)
        if self.ranks[r].phase is Phase.TRAINING and state.phase is not Phase.TRAINING:
            self.later(self.rng.uniform(0.0, 2.0), ("user", r))
        elif self.ranks[r].phase in (Phase.IDLE, Phase.ENDED) and state.phase is not self.ranks[r].phase:
            self.later(self.rng.uniform(0.0, 1.0), ("user", r))

    def _user(self, r: int) -> None:
        """What the training script does next in this rank's state."""
        state = self.ranks[r]
        if state.phase is Phase.IDLE:
            self._rank(r, ev.Close() if self.rng.random() < 0.01 else ev.Begin())
        elif state.phase is Phase.ENDED:
            self._rank(r, ev.Close())
        elif state.phase is Phase.TRAINING and not state.reduced:
            self._rank(r, ev.Reduced(self.rng.random() < 0.95, "FTAR peer died"))
            self.later(self.rng.uniform(0.0, 1.0), ("user", r))
        elif state.phase is Phase.TRAINING and not state.ending:
            self._rank(r, ev.End(1.0, 1))

    # -- the coordinator and its controller

    def _coordinator(self, event) -> None:
        for e in self.core.advance(event, self.now):
            if isinstance(e, co.Broadcast):
                for r in list(self.core.conn_of):
                    self.send("to_rank", (r, e.frame.SerializeToString()))
                if e.frame.WhichOneof("body") == "decision":
                    d = e.frame.decision
                    assert d.attempt not in self.decided, f"attempt {d.attempt} decided twice"
                    self.decided[d.attempt] = d.outcome == rpb.StepDecision.COMMIT
                    if self.decided[d.attempt]:  # the naive reference: every rank's yes arrived first
                        assert self.yes_seen[d.attempt] == set(range(self.world)), (d.attempt, self.yes_seen[d.attempt])
            elif isinstance(e, co.SendTo):
                self.send("to_rank", (e.conn, e.frame.SerializeToString()))
            elif isinstance(e, co.SendEach):
                for conn, frame in e.frames:
                    self.send("to_rank", (conn, frame.SerializeToString()))
            elif isinstance(e, co.RequestQuorum):
                self.later(self.rng.uniform(0.0, 2.0), ("coordinator_event", self._quorum_result(e)))
            elif isinstance(e, co.ReportFinished):
                self.later(0.1, ("coordinator_event", co.FinishReported("COMPLETED")))
            assert not isinstance(e, co.Refuse), e

    def _quorum_result(self, request: co.RequestQuorum) -> co.Event:
        roll = self.rng.random()
        if roll < 0.05:
            return co.QuorumFailed(co.QuorumRefusal.RETRY, "controller unavailable")
        if roll < 0.06:
            return co.QuorumFailed(co.QuorumRefusal.FINISHED, "the job is COMPLETED")
        behind = self.rng.random() < 0.2
        max_step = request.step + (self.rng.randint(0, 3) if behind else 0)
        members = [pb.Member(replica_id="a", step=max_step, healthy=True, ftar_addresses=["fa"] * self.world,
                             state_addresses=["sa"] * self.world),
                   pb.Member(replica_id="b", step=request.step, healthy=not behind,
                             ftar_addresses=list(request.ftar_addresses), state_addresses=list(request.state_addresses))]
        recover = [pb.RecoverAssignment(replica_id="b", sources_by_shard=["a"])] if behind else []
        if self.rng.random() < 0.3:  # a new membership: a new quorum id
            self.quorum_id += 1
        known = request.known_quorum_id == self.quorum_id  # as the controller: no addresses for who holds them
        if known:
            for m in members:
                del m.ftar_addresses[:]
                del m.state_addresses[:]
        return co.QuorumAnswered(pb.QuorumResponse(quorum_id=self.quorum_id, members=members,
                                                   max_step=max_step, recover=recover, lr_scale=1.0,
                                                   addresses_included=not known, total_replicas=2))

def _drive(seed: int) -> World:
    w = World(seed)
    w.run()
    return w


def check(w: World) -> int:
    for attempt, by_rank in w.concluded.items():
        outcomes = set(by_rank.values())
        assert len(outcomes) == 1, f"attempt {attempt} concluded differently: {by_rank}"
        if True in outcomes:
            assert w.decided.get(attempt) is True, f"ranks committed attempt {attempt}, the coordinator did not"
    coordinator_commits = [a for a, commit in sorted(w.decided.items()) if commit]
    for r, state in w.ranks.items():
        mine = w.commits[r]
        assert mine == coordinator_commits[:len(mine)], (r, mine, coordinator_commits)
        if state.phase is not Phase.FAILED:
            assert len(coordinator_commits) - len(mine) <= 1, (r, state.phase, mine, coordinator_commits)
    by_commits = defaultdict(set)
    for r, state in w.ranks.items():
        by_commits[len(w.commits[r])].add((state.step, tuple(sorted(state.ledger.positions.items()))))
    assert all(len(v) == 1 for v in by_commits.values()), dict(by_commits)
    return len(coordinator_commits)


def test_random_event_orders_never_split_a_replica():
    committed = 0
    for seed in range(150):
        w = _drive(seed)
        committed += check(w)
    assert committed > 150  # the runs did commit steps, not only fail

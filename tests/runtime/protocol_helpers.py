"""Shared builders for the pure protocol tests: settings, plans, quorum answers, and a runner."""

from __future__ import annotations

import dataclasses

from fthsdp.data_ledger import DataLedger
from fthsdp.settings import RuntimeSettings
from fthsdp.step import events as ev
from fthsdp.step.plan import RankPlan
from fthsdp.step.protocol import RankState, advance, initial_state
from protos import controller_pb2 as pb
from tests.trainer_secret import SECRET

SETTINGS = RuntimeSettings(job_id="j", replica_id="b", rank=0, world_size=2, controller_address="127.0.0.1:1",
                           coordinator_address="127.0.0.1:2", max_retries=2, quorum_timeout_s=20.0,
                           gather_timeout_s=10.0, allreduce_timeout_s=10.0, fetch_timeout_s=5.0, fetch_attempts=2, fetch_hold_timeout_s=3.0,
                           digest_every_steps=4, job_secret=SECRET).validate()


def plan(step: int = 3, *, behind: bool = False, fetchers: tuple[str, ...] = (), digest: bool = False,
         quorum_id: int = 9, included: tuple[str, ...] = ("a", "b"), writes: bool = False,
         lr_scale: float = 1.0) -> RankPlan:
    included = tuple(r for r in included if not (behind and r == "b"))
    return RankPlan(quorum_id=quorum_id, step=step, behind=behind, fetch_from="10.0.0.1:7" if behind else "",
                    source_replica="a" if behind else "", ftar_group_id="j/rank0", ftar_members=("f0", "f1"),
                    included=included, divisor=len(included), lr_scale=lr_scale, total_replicas=3, fetchers=fetchers,
                    report_digest=digest or behind or bool(fetchers), writes_checkpoint_state=writes)


def state(step: int = 3, settings: RuntimeSettings = SETTINGS, **fields) -> RankState:
    base = initial_state(settings, step, DataLedger({"a": step, "b": step}))
    return dataclasses.replace(base, **fields)


class Run:
    """Feeds events one by one on a fake clock, keeping every effect."""

    def __init__(self, start: RankState, now: float = 100.0) -> None:
        self.state, self.now = start, now
        self.effects: list = []

    def __call__(self, event, *, at: float | None = None) -> tuple:
        if at is not None:
            self.now = at
        self.state, effects = advance(self.state, event, self.now)
        self.effects += effects
        return effects

    def inner_steps(self, n: int, loss: float = 0.5, tokens: int = 8) -> list:
        """`n` semi-synchronous inner steps (Begin, End); their effects."""
        effects = []
        for _ in range(n):
            effects += self(ev.Begin())
            effects += self(ev.End(loss, tokens))
        return effects

    def to_training(self, p: RankPlan, attempt: int = 1) -> tuple:
        self(ev.Begin())
        return self(ev.PlanArrived(attempt, self.state.step, p))

    def to_voting(self, p: RankPlan, attempt: int = 1, ok: bool = True, reason: str = "") -> tuple:
        self.to_training(p, attempt)
        if p.behind:
            self(ev.FetchFinished(True, "", DataLedger({"a": 7, "b": 2})))
        self(ev.Reduced(ok, reason))
        return self(ev.End(0.5, 8))


def answer(max_step: int = 5, members=(("a", 5, True), ("b", 5, True), ("c", 0, False)),
           recover=(("c", ("a", "b")),), addresses: bool = True, world: int = 2, quorum_id: int = 9,
           lr_scale: float = 0.8) -> pb.QuorumResponse:
    out = []
    for rid, step, healthy in members:
        m = pb.Member(replica_id=rid, step=step, healthy=healthy)
        if addresses:
            m.ftar_addresses.extend(f"f{rid}{k}" for k in range(world))
            m.state_addresses.extend(f"s{rid}{k}" for k in range(world))
        out.append(m)
    return pb.QuorumResponse(quorum_id=quorum_id, members=out, max_step=max_step, lr_scale=lr_scale,
                             recover=[pb.RecoverAssignment(replica_id=r, sources_by_shard=list(s)) for r, s in recover],
                             addresses_included=addresses, total_replicas=len(members))

"""ControllerCore.step: the Ready each command produces, on a fake clock.

The rule HA rests on is checked for every row: a section of the durable state the command
changed (replicas, a replica's addresses, an urgent host change) is in `Ready.writes`, so the
shell writes it before the answer or any order leaves. Only the journal and repeated
registrations may be written behind. A command missing from the table fails the last test.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import pytest

from controller.core import commands as c
from controller.core.core import HANDLERS, ControllerCore
from controller.core.diagnosis.telemetry import HostReport, RankReport
from controller.core.errors import FailedPrecondition
from controller.core.host_records import HOST_SHARDS, host_shard
from controller.core.identity import hash_secret
from controller.core.model import Assignment, HostState, JobState, JoinRequest, ReplicaState
from controller.core.pending_writes import JOURNAL, REPLICAS, PendingWrites, addresses_section, host_section
from controller.settings import ControllerSettings

SETTINGS = ControllerSettings(replicas=2, min_replicas=1, heartbeat_timeout_s=10.0)


def cluster() -> ControllerCore:
    """Two replicas of two ranks, each on its own host, one spare; quorum 1 formed at step 0."""
    core = ControllerCore(SETTINGS)
    for host, rid in (("h0", "r0"), ("h1", "r1")):
        core.step(c.RegisterAgent(host, "i-" + host, assignment=Assignment(rid, (0, 1), 2),
                                  secret_hash=hash_secret("secret-" + host)), 0.0)
    core.step(c.RegisterAgent("s0", "i-s0", spare=True, secret_hash=hash_secret("secret-s0")), 0.0)
    for host, rid in (("h0", "r0"), ("h1", "r1")):
        core.step(c.Join(JoinRequest(rid, 0, 2, host_id=host, ftar_addresses=(f"{host}:1", f"{host}:2"))), 0.0)
    assert core.step(c.CloseRound(), 0.0).quorum is not None
    return core


def settled() -> ControllerCore:
    """The cluster, with what its setup asked taken as done (the ticker wrote the rest behind):
    a clean start for a row."""
    core = cluster()
    core.step(c.Tick(), 0.0)
    assert not core.view.pending_writes()
    return core


def durable(core: ControllerCore) -> dict[str, object]:
    """Every section as the store would hold it, less what is durable only now and then: goodput's
    counters (they grow with time) and the order counter (a successor continues from its clock)."""
    s = core.view
    replicas = {k: v for k, v in s.snapshot_replicas().items() if k not in ("goodput", "order_seq")}
    if replicas["quorum"]:  # a fast-path round renews only these, by design never written
        replicas["quorum"] = {k: v for k, v in replicas["quorum"].items() if k not in ("reason", "formed_at")}
    out: dict[str, object] = {REPLICAS: copy.deepcopy(replicas)}
    out.update({addresses_section(rid): s.snapshot_addresses(rid) for rid in s.replicas})
    out.update({host_section(i): s.encoded_host_shard(i) for i in range(HOST_SHARDS)})
    return out


def given(core: ControllerCore, rid: str) -> c.ReportStep:
    r = core.view.replicas[rid]
    return c.ReportStep(rid, r.given_step, quorum_id=r.given_quorum_id, host_id=HOLDER[rid])


HOLDER = {"r0": "h0", "r1": "h1"}


@dataclass
class Row:
    name: str
    command: Callable[[ControllerCore], object]
    #: what must hold of the Ready (and the core) after the step
    check: Callable[[ControllerCore, object], bool]
    before: Callable[[ControllerCore], None] = lambda core: None
    now: float = 1.0
    #: sections that must be in Ready.writes (besides the rule's)
    writes: tuple[str, ...] = ()
    #: sections the command may change without writing them before its answer, and why
    deferred: tuple[str, ...] = ()


def _all_report(core: ControllerCore) -> None:
    core.step(given(core, "r0"), 0.5)


def _silence(core: ControllerCore) -> None:
    core.step(c.Heartbeat(("h1", "s0"), ("r0", "r1")), 8.0)  # h0 goes quiet


ROWS = [
    Row("a new host registers: its agent secret is durable before the answer",
        lambda core: c.RegisterAgent("s1", "i-s1", spare=True, secret_hash="x" * 64),
        lambda core, ready: ready.answer[0] is None and core.view.hosts["s1"].state == HostState.SPARE,
        writes=(host_section(host_shard("s1")),)),
    Row("a restarted agent's registration carries a new agent secret: durable before the answer",
        lambda core: c.RegisterAgent("s0", "i-s0-2", spare=True, secret_hash="y" * 64, previous_secret="secret-s0"),
        lambda core, ready: core.view.hosts["s0"].secret_hash == "y" * 64, writes=(host_section(host_shard("s0")),)),
    Row("a join with new addresses writes them before its answer",
        lambda core: c.Join(JoinRequest("r0", 1, 2, host_id="h0", ftar_addresses=("h0:7", "h0:8"))),
        lambda core, ready: ready.answer is None and ready.quorum is None, writes=(addresses_section("r0"),),
        # a join's answer is its round's: the round that forms a new quorum id writes the
        # replicas; a fast-path round's answers follow from what is already durable
        deferred=(REPLICAS,)),
    Row("a round that forms a new quorum id writes the replicas first",
        lambda core: c.CloseRound(),
        lambda core, ready: ready.quorum is not None and ready.quorum.quorum_id == core.view.quorum.quorum_id
        and ready.round_members == frozenset(),
        before=lambda core: [core.step(c.ReportCommitFailed("r1", 0, "nan", quorum_id=1, host_id="h1"), 0.5)] + [
            core.step(c.Join(JoinRequest(rid, 0, 2, host_id=HOLDER[rid])), 1.0) for rid in ("r0", "r1")],
        writes=(REPLICAS,)),
    Row("a fast-path round (same quorum id) writes nothing",
        lambda core: c.CloseRound(),
        lambda core, ready: ready.quorum is not None and ready.quorum.reason.startswith("fast path")
        and not ready.durable_first,
        # the answers (each replica's given step) are not written: a successor takes the
        # reports that follow from them (test_state_replicas: fast-path answers)
        deferred=(REPLICAS,),
        before=lambda core: [core.step(given(core, rid), 0.5) for rid in ("r0", "r1")] and [
            core.step(c.Join(JoinRequest(rid, 1, 2, host_id=h)), 1.0) for rid, h in (("r0", "h0"), ("r1", "h1"))]),
    Row("a commit report is durable before its answer", lambda core: given(core, "r1"),
        lambda core, ready: core.view.replicas["r1"].committed_step == 0, writes=(REPLICAS,)),
    Row("a failed commit", lambda core: c.ReportCommitFailed("r1", 0, "nan loss", quorum_id=core.view.quorum.quorum_id,
                                                              host_id="h1"),
        lambda core, ready: True, writes=(REPLICAS,)),
    Row("a replica reported dead",
        lambda core: c.ReportReplicaDead("r1", "rank 1 lost its GPU", host_id="h1"),
        lambda core, ready: core.view.replicas["r1"].state == ReplicaState.DEAD, writes=(REPLICAS,)),
    Row("a trainer died", lambda core: c.TrainerExit("h1", "r1", 1, signal=9),
        lambda core, ready: [(o.host_id, o.kind) for o in ready.orders] == [("h1", "RESTART")], writes=(REPLICAS,)),
    Row("a host silent past the timeout: the swap is durable before its orders",
        lambda core: c.Tick(),
        lambda core, ready: [(o.host_id, o.kind) for o in ready.orders] == [("h0", "STOP"), ("s0", "ASSIGN")]
        and JOURNAL in ready.writes + ready.writes_behind, before=_silence, now=10.5,
        writes=(REPLICAS, host_section(host_shard("h0")), host_section(host_shard("s0")))),
    Row("an agent leaves", lambda core: c.DeregisterAgent("s0", "i-s0", "scaled down"),
        lambda core, ready: core.view.hosts["s0"].state == HostState.DEAD, writes=(host_section(host_shard("s0")),)),
    Row("a cordon", lambda core: c.Cordon("s0", "bad fan"),
        lambda core, ready: core.view.hosts["s0"].cordoned, writes=(host_section(host_shard("s0")),)),
    Row("an uncordon", lambda core: c.Uncordon("s0"), lambda core, ready: not core.view.hosts["s0"].cordoned,
        before=lambda core: core.step(c.Cordon("s0", "bad fan"), 0.5), writes=(host_section(host_shard("s0")),)),
    Row("a drain moves the work to the spare first", lambda core: c.Drain("h1"),
        lambda core, ready: ("s0", "ASSIGN") in [(o.host_id, o.kind) for o in ready.orders]
        and isinstance(ready.answer, str), writes=(host_section(host_shard("h1")),)),
    Row("the last replica finished: COMPLETED is durable before the answer says so",
        lambda core: c.ReportFinished("r1", 0, reason="done", host_id="h1"),
        lambda core, ready: ready.answer == JobState.COMPLETED,
        before=lambda core: [core.step(given(core, rid), 0.5) for rid in ("r0", "r1")]
        and core.step(c.ReportFinished("r0", 0, reason="done", host_id="h0"), 0.6), writes=(REPLICAS,)),
    Row("a heartbeat claims nothing durable", lambda core: c.Heartbeat(("h0", "nobody"), ("r0",)),
        lambda core, ready: ready.answer == ["nobody"] and not ready.durable_first),
    Row("an order stream opened: the host's current assignment", lambda core: c.ConnectOrders("h0"),
        lambda core, ready: [(o.kind, o.assignment.replica_id) for o in ready.answer] == [("CURRENT", "r0")]
        and not ready.durable_first),
    Row("an acknowledged order", lambda core: c.AckOrder("h0", "no-such-order", True),
        lambda core, ready: ready.answer is None),
    Row("a join that left the round", lambda core: c.LeaveRound("r0", "its call was cancelled"),
        lambda core, ready: ready.answer is True and "r0" not in core.view.round_joined,
        before=lambda core: core.step(c.Join(JoinRequest("r0", 1, 2, host_id="h0")), 0.5)),
    Row("a leader's connection lost", lambda core: c.ConnectionLost("r0", "its quorum port connection"),
        lambda core, ready: "r0" in core.view.suspects.since,
        before=lambda core: core.step(c.Join(JoinRequest("r0", 1, 2, host_id="h0")), 0.5)),
    Row("telemetry of a host", lambda core: c.Telemetry(HostReport("h0", 1, (RankReport("r0", 0, 0.5, 10.0, ()),)), "secret-h0"),
        lambda core, ready: isinstance(ready.answer, list)),
    Row("a takeover of a running job warns in the journal before anything else is answered",
        lambda core: c.Takeover("ctl-b", 5.0),
        lambda core, ready: JOURNAL in ready.writes and core.view.silence_counted_from == 6.0),
    Row("a look at a round that cannot close", lambda core: c.CloseRound(),
        lambda core, ready: ready.quorum is None and ready.round_members == frozenset({"r0"}),
        before=lambda core: core.step(c.Join(JoinRequest("r0", 1, 2, host_id="h0")), 0.5)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_each_command_writes_what_it_changed_before_its_answer(row: Row):
    core = settled()
    row.before(core)
    command = row.command(core)
    before = durable(core)
    ready = core.step(command, row.now)
    after = durable(core)
    pending = core.view.pending_writes()
    for section in after:
        if after[section] == before.get(section):
            continue
        if section in row.deferred or section.startswith("hosts/") and pending.get(section) is False:
            continue  # a change allowed to wait (for its round, or for the ticker)
        assert section in ready.writes, f"{row.name}: {section} changed but is not written before the answer"
    assert set(row.writes) <= set(ready.writes), (row.name, ready.writes)
    assert row.check(core, ready), (row.name, ready)
    assert len(set(ready.writes)) == len(ready.writes), ready.writes  # no section twice


def test_a_failed_write_goes_back_to_the_core_with_its_orders_and_comes_out_again():
    core = settled()
    ready = core.step(c.TrainerExit("h1", "r1", 1, signal=9), 1.0)
    assert REPLICAS in ready.writes and ready.orders
    again = core.step(c.WriteFailed(ready.writes, ready.orders), 1.1)
    assert again.writes == () and again.orders == ()  # not in the same breath: at the next chance
    nxt = core.step(c.CloseRound(), 1.2)
    # again before the next answer, all but the journal (always written behind when it failed)
    assert set(ready.writes) - {JOURNAL} <= set(nxt.writes) and nxt.orders[:len(ready.orders)] == ready.orders
    assert core.view.pending_writes() == ({JOURNAL: False} if JOURNAL in ready.writes else {})


def test_a_refused_command_asks_nothing_and_changes_nothing():
    core = settled()
    before = durable(core)
    with pytest.raises(FailedPrecondition, match="'r9' is unknown"):
        core.step(c.ReportStep("r9", 0, quorum_id=1), 1.0)
    with pytest.raises(FailedPrecondition):
        core.step(c.ReportStep("r0", 5, quorum_id=core.view.quorum.quorum_id, host_id="h0"), 1.0)
    assert durable(core) == before and not core.view.pending_writes().get(REPLICAS)
    with pytest.raises(TypeError, match="str is not a controller command"):
        core.step("join", 1.0)


def test_the_ticker_writes_the_rest_behind():
    core = settled()
    first = core.step(c.Join(JoinRequest("r0", 1, 2, host_id="h0")), 1.0)  # an info event: for the status page
    first = core.step(c.LeaveRound("r0", "its call ended"), 1.0)
    assert JOURNAL not in first.writes and core.view.pending_writes() == {JOURNAL: False}
    ready = core.step(c.Tick(), 1.1)
    assert ready.writes_behind == (JOURNAL,) and not core.view.pending_writes()


def test_pending_writes_order_and_urgency():
    w = PendingWrites()
    w.mark(JOURNAL, urgent=False)
    w.mark(host_section(10), urgent=False)
    w.mark(host_section(2))
    w.mark(REPLICAS, urgent=False)  # the replicas section is always urgent
    w.mark(addresses_section("r1"))
    assert w.take(background=False) == ("addresses/r1", REPLICAS, "hosts/2")
    assert w.take(background=True) == (JOURNAL, "hosts/10")
    w.failed([JOURNAL, "hosts/3"])
    assert w.pending() == {JOURNAL: False, "hosts/3": True}
    with pytest.raises(ValueError, match="unknown store section 'nonsense'"):
        w.mark("nonsense")


def test_every_command_is_in_the_table():
    core = cluster()
    seen = {type(row.command(core)) for row in ROWS} | {c.WriteFailed}  # WriteFailed: its own test above
    assert seen == set(HANDLERS), set(HANDLERS) - seen

"""A leader connection closed without goodbye makes its replica suspect at once (fake clock,
in the pure core; then on a real quorum port: the kernel's reset of a dead leader's socket)."""

import asyncio
import json

import httpx

from controller.core.model import Assignment, JoinRequest, ReplicaState
from controller.core.quorum import RoundView, compute_quorum
from controller.service.event_log import event_line
from controller.settings import ControllerSettings
from fthsdp.step.quorum_port_client import resolve
from protos.quorum_wire import JOIN, PREAMBLE, frame

from .conftest import quorum_request, wait_for
from .test_quorum_port import PortLeader
from tests.controller.drive import Driver

SETTINGS = ControllerSettings(replicas=2, min_replicas=1, join_timeout_s=5.0, heartbeat_timeout_s=10.0)


def running():
    """r0, r1 (rank 0 on hosts h0, h1) in a quorum at step 0, committed."""
    s = Driver(SETTINGS)
    for i in range(2):
        s.register(f"h{i}", f"i{i}", 0.0, assignment=Assignment(f"r{i}", (0,), 1))
        s.join(JoinRequest(f"r{i}", 0, 1, incarnation="one", host_id=f"h{i}"), 0.0)
    q = s.close_round(0.0)
    for i in range(2):
        s.report(f"r{i}", 0, 0.5, quorum_id=q.quorum_id, host_id=f"h{i}")
    return s


def test_without_suspects_a_lone_survivor_waits_for_the_majority():
    s = running()
    s.join(JoinRequest("r0", 1, 1, incarnation="one", host_id="h0"), 1.0)
    assert s.close_round(1.0) is None
    assert s.view.round_reason == "waiting: 1 joined (r0) is not a majority of 2 live replicas; missing r1"


def test_a_lost_connection_lets_the_survivor_form_its_quorum_at_once():
    s = running()
    assert s.connection_lost("r1", "its leader's quorum port connection", 1.0)
    assert not s.connection_lost("r1", "its leader's quorum port connection", 1.01)  # said once
    [event] = [e for e in s.view.events if e.kind == "suspect"]
    assert event.level == "warning" and "replica r1 is suspect: its leader's quorum port connection closed" \
                                      " without goodbye" in event.message
    s.join(JoinRequest("r0", 1, 1, incarnation="one", host_id="h0"), 1.1)
    q = s.close_round(1.1)
    assert q is not None and q.member_ids == {"r0"}
    assert q.reason == "all 1 live replicas joined (r1 suspect: its coordinator's connection closed)"
    # suspicion is no death: r1 is left out of the quorum, not DEAD, and no death is counted
    assert s.view.replicas["r1"].state == ReplicaState.JOINING and s.view.deaths == {}


def test_a_join_or_a_later_heartbeat_clears_the_suspicion():
    s = running()
    s.connection_lost("r1", "x", 1.0)
    s.beat_hosts(["h1"], 1.0)  # not after the loss: proves nothing
    assert s.view.suspects.ids() == {"r1"}
    s.beat_hosts(["h0"], 1.5)  # another host's heartbeat: nothing about r1
    assert s.view.suspects.ids() == {"r1"}
    s.beat_hosts(["h1"], 1.5)
    assert s.view.suspects.ids() == frozenset()
    assert any("replica r1 is no longer suspect: a heartbeat of host h1" in e.message for e in s.view.events)
    s.connection_lost("r1", "x", 2.0)
    s.beat_replicas(["r1"], 2.5)
    assert s.view.suspects.ids() == frozenset()
    s.connection_lost("r1", "x", 3.0)
    s.join(JoinRequest("r1", 1, 1, incarnation="one", host_id="h1"), 3.1)
    assert s.view.suspects.ids() == frozenset()
    s.join(JoinRequest("r0", 1, 1, incarnation="one", host_id="h0"), 3.2)
    assert s.close_round(3.2).member_ids == {"r0", "r1"}


def test_a_dead_or_finished_replica_is_not_made_suspect():
    s = running()
    s.report_dead("r1", "gone", 1.0, host_id="h1")
    assert not s.connection_lost("r1", "x", 1.1) and not s.connection_lost("r9", "x", 1.1)


def test_the_majority_rule_leaves_suspects_out_and_names_them():
    view = RoundView(joined={"r0": 3}, first_join_at=0.0, live=frozenset({"r0", "r1", "r2"}),
                     previous=frozenset({"r0", "r1", "r2"}), suspect=frozenset({"r1"}))
    d = compute_quorum(view, 0.1, min_replicas=1, join_timeout_s=5.0)
    assert d.members is None and d.reason == ("waiting: 1 joined (r0) is not a majority of 2 live replicas; "
                                              "missing r2, r1 (suspect)")
    view = RoundView(joined={"r0": 3, "r2": 3}, first_join_at=0.0, live=frozenset({"r0", "r1", "r2"}),
                     previous=frozenset({"r0", "r1", "r2"}), suspect=frozenset({"r1"}))
    d = compute_quorum(view, 0.1, min_replicas=1, join_timeout_s=5.0)
    assert d.members == {"r0", "r2"}


async def test_a_dead_leaders_port_connection_makes_the_round_close_without_it(server):
    """On the real port: r2's leader connection closes (as the kernel closes a SIGKILLed
    process's socket); r0 and r1's next round closes at once on the controller's fake clock,
    which never reaches the join timeout (without the suspicion it would wait for r2)."""
    s = server.state
    leaders = [PortLeader(server.quorum_address, rid) for rid in ("r0", "r1", "r2")]
    first = await asyncio.gather(*(p.ask(0) for p in leaders))
    assert {m.replica_id for m in first[0].members} == {"r0", "r1", "r2"}
    leaders[2].client.close()
    await wait_for(lambda: s.suspects.ids() == {"r2"}, 10, "r2 suspect")
    answers = await asyncio.gather(*(p.ask(1) for p in leaders[:2]))
    assert [m.replica_id for m in answers[0].members] == ["r0", "r1"]
    assert "r2 suspect" in s.quorum.reason and server.clock.now == 1000.0


async def test_rest_events_carry_the_event_logs_ts_beside_at(server):
    """REST's events and the JSON event log name an event's time alike (`ts`), `at` kept."""
    async with httpx.AsyncClient(base_url=server.http_url, timeout=10) as http:
        events = (await http.get("/api/v1/events")).json()
    by_seq = {e.seq: e for e in server.state.events}
    assert events
    for e in events:
        assert e["ts"] == json.loads(event_line("t", by_seq[e["seq"]]))["ts"] and isinstance(e["at"], float)

"""Attack 7 of issue 23 on real processes: one agent of the job, with its own valid credentials,
reports that its rank has waited 30 s in an FTAR all-reduce for a rank of another host. The
real controller finds the "hang" and names that host -- and evicts nobody on one host's word
(controller/core/diagnosis/policy.py, rule 1b): the victim's own telemetry, sent by its real
agent from its real trainer's ring, shows it busy.

The same claim made by two other hosts (two colluding agents: "more than one other host")
does evict the victim onto the spare: the attack reaches the decision, and the evidence rule is
what refuses it (so the test could fail).

Processes: a real controller holding the job secret; the victim h0 (a real agent, its trainer
r0's leader, recording intra-replica and FTAR collectives in its telemetry ring); a real spare
agent s0; the attacker(s): real gRPC clients on loopback that register with the job secret as
hosts holding replicas r1 (and r2), lead them into the quorum and report telemetry."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import pytest

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos import credentials, job_secret
from protos.telemetry_ring import Kind
from tests.agent.cluster import Cluster
from tests.agent.helpers import trainer_command, wait_for, wait_for_async

from .harness import beat_forever, open_channel

pytestmark = pytest.mark.slow
BOUND_S = 45
VICTIM, SPARE = "h0", "s0"
GROUP = "ftar.q1"
CLAIMED_S = 30.0  # the hang the attacker claims
#: a collective far beyond any the victim's ring has joined: the victim "never joined" it
CLAIMED_SEQ = 10 ** 6


class Attacker:
    """An agent of the job that holds its own valid secret (it registered with the job
    secret) and leads its replica: everything it sends is authenticated, and it lies."""

    def __init__(self, stub: pbg.ControllerStub, secret: job_secret.JobSecret, host_id: str, replica_id: str):
        self.stub, self.secret, self.host_id, self.replica_id = stub, secret, host_id, replica_id
        self.credential = credentials.host_credential(credentials.trainer_token(secret, host_id))
        self.agent_secret = ""
        self.tasks: list[asyncio.Task] = []

    async def register(self) -> None:
        incarnation = uuid.uuid4().hex
        reply = await self.stub.RegisterAgent(pb.RegisterAgentRequest(
            host_id=self.host_id, incarnation=incarnation, slots=1,
            proof=credentials.registration_proof(self.secret, self.host_id, incarnation, time.time()),
            assignment=pb.Assignment(replica_id=self.replica_id, ranks=[0], world_size=1)), timeout=10)
        assert reply.agent_secret and reply.assignment.replica_id == self.replica_id, reply
        self.agent_secret = reply.agent_secret
        self.tasks += [asyncio.ensure_future(beat_forever(self.stub, self.host_id, self.agent_secret,
                                                          self.replica_id, self.credential)),
                       asyncio.ensure_future(self._lead())]

    async def _lead(self) -> None:
        """Join every round and commit its step, as a real leader does (so its replica is in
        the quorum, and its rank in the FTAR ring it lies about)."""
        step, known, incarnation = 0, 0, uuid.uuid4().hex
        while True:
            q = await self.stub.Quorum(pb.QuorumRequest(
                replica_id=self.replica_id, step=step, world_size=1, known_quorum_id=known, incarnation=incarnation,
                host_id=self.host_id, credential=self.credential, ftar_addresses=["127.0.0.1:1"],
                state_addresses=["127.0.0.1:2"]), timeout=30)
            await self.stub.ReportStep(pb.ReportStepRequest(
                replica_id=self.replica_id, quorum_id=q.quorum_id, step=q.max_step, host_id=self.host_id,
                credential=self.credential), timeout=30)
            step, known = q.max_step + 1, q.quorum_id
            await asyncio.sleep(0.3)  # a step's pace

    async def claim_hang(self, members: int) -> list[str]:
        """"My rank joined FTAR all-reduce #CLAIMED_SEQ CLAIMED_S ago and nobody came": a
        report that is well-formed, authenticated and about the attacker's own rank."""
        group = pb.GroupTelemetry(group=GROUP, kind=int(Kind.FTAR_ALL_REDUCE), size=members,
                                  last_joined_seq=CLAIMED_SEQ, last_done_seq=CLAIMED_SEQ - 1, pending_seq=CLAIMED_SEQ,
                                  pending_s=CLAIMED_S, pending_nbytes=1 << 20, pending_sent_bytes=4096,
                                  pending_idle_s=CLAIMED_S - 1)
        reply = await self.stub.ReportTelemetry(pb.TelemetryReport(
            host_id=self.host_id, agent_secret=self.agent_secret, window_collectives=4,
            ranks=[pb.RankTelemetry(replica_id=self.replica_id, rank=0, idle_s=CLAIMED_S - 1, recording_s=600.0,
                                    groups=[group])]), timeout=10)
        return list(reply.ignored)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def hang_findings(c: Cluster) -> list[dict]:
    return [f for f in (await c.get("/api/v1/diagnoses?kind=hang"))["findings"] if f["kind"] == "hang"]


async def current_members(c: Cluster) -> set[str]:
    current = (await c.get("/api/v1/quorums"))["current"]
    return {m["replica_id"] for m in current["members"]} if current else set()


@pytest.mark.parametrize("liars", (1, 2), ids=("one-other-host", "two-other-hosts"))
async def test_7_one_agent_cannot_evict_another_host_by_claiming_it_hangs(tmp_path, liars):
    replicas = 1 + liars
    c = Cluster(tmp_path, heartbeat_timeout_s=10.0)
    channel = None
    attackers: list[Attacker] = []
    try:
        settings = tmp_path / "controller.json"
        settings.write_text(json.dumps({"diagnosis": {"hang_after_s": 2.0, "analysis_interval_s": 0.5}}))
        await c.start_controller(replicas, 0, "--settings", str(settings))
        command = trainer_command(c.ready_dir, "--join", "--telemetry", "none:none", "--ftar", f"{GROUP}:{replicas}")
        extra = ("--telemetry-interval-s", "0.5", "--telemetry-window-collectives", "4")
        await c.start_agent(VICTIM, replica="r0", rank=0, world_size=1, command=command, extra=extra)
        await c.start_agent(SPARE, spare=True, command=command, extra=extra)
        [victim_trainer] = await wait_for(lambda: c.trainers("r0", "0") or None, BOUND_S, "r0's trainer")

        channel = await open_channel(c.grpc)
        secret = job_secret.parse(c.secret, "the cluster's job secret")
        attackers = [Attacker(pbg.ControllerStub(channel), secret, f"hA{i}", f"r{i}") for i in range(1, replicas)]
        for a in attackers:
            await a.register()
        everyone = {f"r{i}" for i in range(replicas)}
        await wait_for_async(lambda: _true_if(current_members(c), everyone), BOUND_S, "every replica in the quorum")
        # The victim's own telemetry reaches the controller: its ring records collectives in
        # both groups, and its agent reports every 0.5 s; six of r0's steps (0.3 s apart) after
        # the ring exists span several reports.
        ring = victim_trainer["env"]["FTHSDP_TELEMETRY_FILE"]
        await wait_for(lambda: os.path.exists(ring) or None, BOUND_S, "the victim's ring")
        start = (await c.replica("r0"))["committed_step"]
        await wait_for_async(lambda: _true_if(c.replica("r0"), lambda r: r["committed_step"] >= start + 6),
                             BOUND_S, "r0 to commit six more steps")

        for a in attackers:
            assert await a.claim_hang(replicas) == []  # accepted as it is: a rank's first report
        [finding] = await wait_for_async(lambda: hang_findings(c), BOUND_S, "the claimed hang found")
        assert finding["hosts"][0] == VICTIM and finding["ranks"][0] == "r0/0", finding
        assert f"collective #{CLAIMED_SEQ} of group {GROUP}" in finding["summary"], finding
        # the victim's own report says it is not in that collective: it never joined it
        assert any(e.startswith("rank r0/0 on host h0 never joined") for e in finding["evidence"]), finding

        if liars == 2:  # two other hosts' word is evidence: the victim is evicted onto the spare
            assert finding["action"] == "evict", finding
            await wait_for_async(lambda: _true_if(c.host(VICTIM), lambda h: h["cordoned"]), BOUND_S, "h0 cordoned")
            await wait_for_async(lambda: _true_if(c.host(SPARE), lambda h: (h["assignment"] or {}).get("replica_id")
                                                  == "r0"), BOUND_S, "r0 moved to the spare")
            return

        # One other host's word: reported, never acted on.
        assert finding["action"] == "report", finding
        assert "only 1 other host(s) (hA1)" in finding["action_reason"], finding
        # The job is as it was: h0 holds r0 and runs the same trainer, the spare is free, no
        # swap, and r0 still commits steps (its leader is the victim's real trainer).
        before = (await c.replica("r0"))["committed_step"]
        await wait_for_async(lambda: _true_if(c.replica("r0"), lambda r: r["committed_step"] >= before + 3),
                             BOUND_S, "r0 to commit three more steps")
        victim, spare = await c.host(VICTIM), await c.host(SPARE)
        assert not victim["cordoned"] and victim["state"] == "ACTIVE", victim
        assert victim["assignment"]["replica_id"] == "r0", victim
        assert spare["state"] == "SPARE" and spare["assignment"] is None, spare
        assert (await c.get("/api/v1/job"))["swaps"] == 0
        assert [t["pid"] for t in c.trainers("r0", "0")] == [victim_trainer["pid"]]
        assert (await c.replica("r0"))["state"] == "HEALTHY"
        page = await c.get("/api/v1/diagnoses")
        assert page["actions_by_kind"]["evict"] == 0, page
    finally:
        for a in attackers:
            await a.stop()
        if channel is not None:
            await channel.close()
        await c.close()


async def _true_if(view, want):
    """`view` awaited, if `want` (a value, or a predicate of it) holds; else None."""
    got = await view
    ok = want(got) if callable(want) else got == want
    return got if ok else None


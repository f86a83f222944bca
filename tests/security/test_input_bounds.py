"""Bounded input on every field of the wire contract, against a real controller process.

Each attack is one request that is legitimate except for one field. It must be refused with a
clear, short message naming the field (or, for free text, kept cut with a marker); the status
views must be as they were; the legitimate agent and leader keep working; the controller's
memory does not grow with the attacks.
"""

from __future__ import annotations

import math

import grpc
import httpx
import pytest

from protos import controller_pb2 as pb
from protos import credentials

from .harness import HOST, HUGE, JOB, LEADER_CREDENTIAL, REPLICA, SECRET, expect_refused, picture, proof, rss, settled_rss

pytestmark = pytest.mark.slow
INVALID, PRECONDITION, DENIED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                                 grpc.StatusCode.PERMISSION_DENIED)
X = "x" * HUGE


def agent_requests(secret: str) -> dict:
    """Legitimate requests of h0's agent and of a newcomer, by RPC name."""
    return {
        "RegisterAgent": pb.RegisterAgentRequest(host_id="h1", incarnation="h1-1", slots=1, labels={"zone": "a"},
                                                 assignment=pb.Assignment(replica_id="r1", ranks=[0], world_size=1),
                                                 proof=proof("h1", "h1-1")),
        "Orders": pb.OrdersRequest(host_id=HOST, incarnation="h0-incarnation", agent_secret=secret),
        "AckOrder": pb.AckOrderRequest(host_id=HOST, order_id="o1", ok=True, agent_secret=secret),
        "ReportTrainerExit": pb.TrainerExitRequest(host_id=HOST, replica_id=REPLICA, rank=0, exit_code=1,
                                                   agent_secret=secret),
        "DeregisterAgent": pb.DeregisterAgentRequest(host_id=HOST, incarnation="h0-incarnation", agent_secret=secret,
                                                     reason="stopping"),
    }


def leader_requests(legit) -> dict:
    return {
        "Quorum": legit.quorum_request(step=legit.step + 1),
        "ReportStep": legit.report(),
        "ReportFailure": pb.ReportFailureRequest(job_id=JOB, replica_id=REPLICA, quorum_id=legit.quorum_id,
                                                 step=legit.step, kind=pb.ReportFailureRequest.COMMIT_FAILED,
                                                 host_id=HOST, credential=LEADER_CREDENTIAL),
    }


def with_field(request, path: str, value):
    """A copy of `request` with the field at `path` set: `a.b`, `list[0]`, `map{key}` (the key
    itself) or `map[key]` (its value)."""
    out = type(request)()
    out.CopyFrom(request)
    *parents, last = path.split(".")
    target = out
    for name in parents:
        target = getattr(target, name)
    if last.endswith("}"):
        name, key = last[:-1].split("{")
        getattr(target, name)[value] = "v"
    elif last.endswith("]"):
        name, index = last[:-1].split("[")
        field = getattr(target, name)
        if isinstance(field, (list,)) or hasattr(field, "append"):
            field[int(index)] = value
        else:
            field[index] = value
    else:
        setattr(target, last, value)
    return out


async def call(stub, rpc: str, request):
    if rpc == "Orders":
        return await stub.Orders(request, timeout=10).read()
    if rpc == "Heartbeat":
        async def beats():
            yield request
        return [reply async for reply in stub.Heartbeat(beats(), timeout=10)]
    return await getattr(stub, rpc)(request, timeout=10)


# (rpc, field, code, what the message names). Free-text fields are in test_free_text_is_cut.
OVERSIZED_STRINGS = [
    ("Quorum", "job_id", PRECONDITION, "job_id 'xxx"),
    ("Quorum", "replica_id", INVALID, f"replica_id 'xxx"),
    ("Quorum", "incarnation", INVALID, f"incarnation 'xxx"),
    ("Quorum", "host_id", INVALID, f"host_id 'xxx"),
    ("Quorum", "leader_address", INVALID, "leader_address 'xxx"),
    ("Quorum", "ftar_addresses[0]", INVALID, "ftar_addresses[0] 'xxx"),
    ("Quorum", "state_addresses[0]", INVALID, "state_addresses[0] 'xxx"),
    ("ReportStep", "job_id", PRECONDITION, "job_id 'xxx"),
    ("ReportStep", "replica_id", INVALID, "replica_id 'xxx"),
    ("ReportStep", "host_id", INVALID, "host_id 'xxx"),
    ("ReportFailure", "job_id", PRECONDITION, "job_id 'xxx"),
    ("ReportFailure", "replica_id", INVALID, "replica_id 'xxx"),
    ("ReportFailure", "host_id", INVALID, "host_id 'xxx"),
    ("RegisterAgent", "host_id", INVALID, "host_id 'xxx"),
    ("RegisterAgent", "incarnation", INVALID, "incarnation 'xxx"),
    ("RegisterAgent", "labels{key}", INVALID, "label key 'xxx"),
    ("RegisterAgent", "labels[zone]", INVALID, "label zone='xxx"),
    ("RegisterAgent", "assignment.replica_id", INVALID, "assignment replica_id 'xxx"),
    ("RegisterAgent", "address", INVALID, "address 'xxx"),
    ("RegisterAgent", "previous_secret", INVALID, "previous_secret is"),
    ("Orders", "host_id", INVALID, "host_id 'xxx"),
    ("Orders", "incarnation", PRECONDITION, "incarnation 'xxx"),
    ("Orders", "agent_secret", DENIED, "agent secret is wrong"),
    ("AckOrder", "host_id", INVALID, "host_id 'xxx"),
    ("AckOrder", "order_id", INVALID, "order_id 'xxx"),
    ("AckOrder", "agent_secret", DENIED, "agent secret is wrong"),
    ("ReportTrainerExit", "host_id", INVALID, "host_id 'xxx"),
    ("ReportTrainerExit", "replica_id", INVALID, "replica_id 'xxx"),
    ("ReportTrainerExit", "agent_secret", DENIED, "agent secret is wrong"),
    ("DeregisterAgent", "host_id", INVALID, "host_id 'xxx"),
    ("DeregisterAgent", "incarnation", INVALID, "incarnation 'xxx"),
    ("DeregisterAgent", "agent_secret", DENIED, "agent secret is wrong"),
]


def requests_for(target, legit) -> dict:
    return {**agent_requests(target.secret), **leader_requests(legit),
            "Heartbeat": pb.HeartbeatRequest(host_ids=[HOST], replica_ids=[REPLICA])}


@pytest.mark.parametrize("rpc, path, code, named", OVERSIZED_STRINGS, ids=[f"{r}.{p}" for r, p, *_ in OVERSIZED_STRINGS])
async def test_an_oversized_string_in_any_field_is_refused_and_changes_nothing(target, legit, rpc, path, code, named):
    before = await picture(target.ctl.http)
    request = with_field(requests_for(target, legit)[rpc], path, X)
    await expect_refused(call(legit.stub, rpc, request), code, named)
    assert await picture(target.ctl.http) == before
    await legit.still_served(target.ctl.http)


def huge_lists(secret: str, legit) -> list[tuple[str, str, object, grpc.StatusCode, str]]:
    million = list(range(1_000_000))
    fat = ["f" * 217] * 8192
    return [
        ("RegisterAgent", "a million ranks of a world of a million", pb.RegisterAgentRequest(
            host_id="h9", incarnation="i", proof=proof("h9", "i"), assignment=pb.Assignment(replica_id="r9", ranks=million, world_size=1_000_000)),
         INVALID, "names 1000000 ranks"),
        ("RegisterAgent", "a million ranks on one host", pb.RegisterAgentRequest(
            host_id="h9", incarnation="i", proof=proof("h9", "i"), assignment=pb.Assignment(replica_id="r9", ranks=million, world_size=65536)),
         INVALID, "names 1000000 ranks; one host runs at most 1024"),
        ("RegisterAgent", "ten thousand labels", pb.RegisterAgentRequest(
            host_id="h9", incarnation="i", proof=proof("h9", "i"), spare=True, labels={f"k{i}": "v" for i in range(10_000)}),
         INVALID, "sent 10000 labels; the limit is 32"),
        ("RegisterAgent", "a million slots", pb.RegisterAgentRequest(host_id="h9", incarnation="i", proof=proof("h9", "i"), spare=True,
                                                                   slots=1_000_000),
         INVALID, "slots must be 0..1024, got 1000000"),
        ("Quorum", "a million addresses for one rank", legit.quorum_request(ftar_addresses=["a:1"] * 1_000_000),
         INVALID, "has 1000000 entries but world_size is 1"),
        ("Quorum", "a world of a million", legit.quorum_request(world_size=1_000_000, ftar_addresses=[],
                                                               state_addresses=[]),
         INVALID, "world_size must be 1..65536, got 1000000"),
        ("Quorum", "8192 × 2 addresses of 217 characters (too big for one store write)", pb.QuorumRequest(
            job_id=JOB, replica_id="r7", step=0, world_size=8192, ftar_addresses=fat, state_addresses=fat,
            credential=credentials.replica_credential(SECRET, "r7")),
         INVALID, "the addresses of replica r7 take"),
        ("Heartbeat", "two hundred thousand ids", pb.HeartbeatRequest(host_ids=[f"h{i}" for i in range(200_000)]),
         INVALID, "a heartbeat names 200000 ids"),
        ("ReportStep", "a request over the 8 MiB limit", legit.report(host_id="h" * (9 << 20)),
         grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
        ("RegisterAgent", "a port past 65535", pb.RegisterAgentRequest(
            host_id="h9", incarnation="i", proof=proof("h9", "i"), spare=True, address="10.0.0.9", rendezvous_port=70_000, coordinator_port=1),
         INVALID, "rendezvous_port must be 1..65535, got 70000"),
        ("RegisterAgent", "an address with a port", pb.RegisterAgentRequest(
            host_id="h9", incarnation="i", proof=proof("h9", "i"), spare=True, address="10.0.0.9:80", rendezvous_port=1, coordinator_port=2),
         INVALID, "without a port"),
        ("ReportTrainerExit", "a version past 2^53", pb.TrainerExitRequest(
            host_id=HOST, replica_id=REPLICA, rank=0, exit_code=1, agent_secret=secret, version=2**60),
         INVALID, "version 1152921504606846976 is larger than the limit"),
    ]


HUGE_LIST_IDS = ["million-ranks-world", "million-ranks", "labels", "slots", "million-addresses", "million-world",
                 "fat-addresses", "heartbeat-ids", "over-8MiB", "port", "address-with-port", "exit-version"]


@pytest.mark.parametrize("index", range(len(HUGE_LIST_IDS)), ids=HUGE_LIST_IDS)
async def test_huge_lists_and_numbers_are_refused_before_they_allocate(target, legit, index):
    rpc, what, request, code, named = huge_lists(target.secret, legit)[index]
    before, rss_before = await picture(target.ctl.http), rss(target.ctl)
    await expect_refused(call(legit.stub, rpc, request), code, named)
    assert await picture(target.ctl.http) == before, what
    # A refused request keeps nothing: at most its own transient buffers stay with the
    # allocator (a request is at most 8 MiB; a million ranks held would be 125 MiB).
    assert rss(target.ctl) - rss_before < 40, (what, rss(target.ctl) - rss_before)
    await legit.still_served(target.ctl.http)


NON_FINITE = [("loss", math.nan), ("loss", math.inf), ("loss", -math.inf), ("step_time_s", math.inf),
              ("step_time_s", math.nan), ("step_time_s", -1.0)]


@pytest.mark.parametrize("field, value", NON_FINITE, ids=[f"{f}={v}" for f, v in NON_FINITE])
async def test_non_finite_and_negative_floats_are_refused(target, legit, field, value):
    await legit.join()
    before = await picture(target.ctl.http)
    shown = "nan" if math.isnan(value) else str(value)
    await expect_refused(legit.stub.ReportStep(legit.report(**{field: value}), timeout=10), INVALID, field, shown)
    assert await picture(target.ctl.http) == before
    async with httpx.AsyncClient(base_url=target.ctl.http) as http:
        assert (await http.get("/api/v1/replicas")).status_code == 200
    await legit.stub.ReportStep(legit.report(), timeout=10)  # the real report of this step still counts
    legit.step += 1


def impossible(legit) -> list[tuple[str, object, grpc.StatusCode, str]]:
    q, s = legit.quorum_id, legit.step
    return [
        ("a jump to 10^15 with a wrong quorum", legit.report(step=10**15, quorum_id=q + 7), PRECONDITION,
         f"commit of step {10**15} in quorum {q + 7}"),
        ("int64 max", legit.report(step=2**63 - 1), INVALID, f"step {2**63 - 1} is larger than the limit"),
        ("a negative step", legit.report(step=-1), INVALID, "step must not be negative, got -1"),
        ("one step too far", legit.report(step=s + 1), PRECONDITION, f"was quorum {q} at step {s}"),
        ("the right step of another quorum", legit.report(quorum_id=q - 1), PRECONDITION, f"quorum {q - 1}"),
        ("negative tokens", legit.report(tokens=-5), INVALID, "tokens must not be negative, got -5"),
        ("a commit failure of another quorum", pb.ReportFailureRequest(
            job_id=JOB, replica_id=REPLICA, quorum_id=q + 1, step=s, kind=pb.ReportFailureRequest.COMMIT_FAILED,
            host_id=HOST, credential=LEADER_CREDENTIAL), PRECONDITION, "failed commit of step"),
        ("a quorum at int64 max", legit.quorum_request(step=2**63 - 1), INVALID, "is larger than the limit"),
        ("a quorum at a negative step", legit.quorum_request(step=-5), INVALID, "step must not be negative"),
    ]


IMPOSSIBLE_IDS = ["jump", "int64-max", "negative", "one-too-far", "other-quorum", "tokens", "failure-other-quorum",
                  "quorum-int64-max", "quorum-negative"]


@pytest.mark.parametrize("index", range(len(IMPOSSIBLE_IDS)), ids=IMPOSSIBLE_IDS)
async def test_impossible_steps_are_refused_and_the_next_quorum_is_no_rollback(target, legit, index):
    await legit.join()
    what, request, code, named = impossible(legit)[index]
    before = await picture(target.ctl.http)
    rpc = "Quorum" if isinstance(request, pb.QuorumRequest) else (
        "ReportFailure" if isinstance(request, pb.ReportFailureRequest) else "ReportStep")
    await expect_refused(call(legit.stub, rpc, request), code, named)
    assert await picture(target.ctl.http) == before, what
    await legit.stub.ReportStep(legit.report(), timeout=10)
    legit.step += 1
    q = await legit.join()
    assert "ROLLBACK" not in q.reason and q.max_step == legit.step


async def test_a_repeated_report_counts_once(target, legit):
    await legit.join()
    await legit.stub.ReportStep(legit.report(tokens=7), timeout=10)
    after_first = await picture(target.ctl.http)
    await legit.stub.ReportStep(legit.report(tokens=7), timeout=10)  # a retry whose answer was lost
    assert await picture(target.ctl.http) == after_first


async def test_free_text_is_cut_with_a_marker(target, legit):
    await legit.join()
    await legit.stub.ReportFailure(pb.ReportFailureRequest(
        job_id=JOB, replica_id=REPLICA, quorum_id=legit.quorum_id, step=legit.step, host_id=HOST,
        credential=LEADER_CREDENTIAL, kind=pb.ReportFailureRequest.COMMIT_FAILED, reason="why " + X + "\nsecond line"), timeout=10)
    await legit.stub.AckOrder(pb.AckOrderRequest(host_id=HOST, order_id="o-cut", ok=False, error="e" * HUGE,
                                                 agent_secret=target.secret), timeout=10)
    async with httpx.AsyncClient(base_url=target.ctl.http) as http:
        events = (await http.get("/api/v1/events", params={"limit": 1000})).json()
    failed = [e for e in events if e["kind"] == "commit_failed"][-1]["message"]
    refused = [e for e in events if e["kind"] == "order_failed"][-1]["message"]
    for message in (failed, refused):
        assert "more characters cut]" in message and len(message) <= 2048 and "\n" not in message
    await legit.still_served(target.ctl.http)


async def test_the_attack_volley_leaves_memory_bounded(target, legit):
    """Every refused attack again, eight times over: the controller keeps none of them.

    One volley sends about 110 MiB (36 strings of 2 MiB, a million ranks twice, a million
    addresses, a 9 MiB request, ...). The allocator and gRPC keep buffers for a while: a reading
    right after a volley is some 10 MiB higher per volley until the trimmer gives them back, and
    even settled readings wander by some 30 MiB as glibc's arenas fragment. So the bound is on
    what stays, taken on both sides of that wander: the lower settled RSS after volleys 7 and 8
    may exceed the higher after volleys 1 and 2 by at most 40 MiB, where keeping even an eighth
    of every refused request would add 5 × 110 / 8 = 69 MiB; and no reading may exceed the start
    by more than 160 MiB."""
    samples = [rss(target.ctl)]
    settled = {}
    for n in range(1, 9):
        reqs = requests_for(target, legit)
        for rpc, path, code, named in OVERSIZED_STRINGS:
            await expect_refused(call(legit.stub, rpc, with_field(reqs[rpc], path, X)), code)
        for rpc, _, request, code, _ in huge_lists(target.secret, legit):
            await expect_refused(call(legit.stub, rpc, request), code)
        samples.append(rss(target.ctl))
        if n in (1, 2, 7, 8):
            settled[n] = await settled_rss(target.ctl)
    kept = min(settled[7], settled[8]) - max(settled[1], settled[2])
    assert kept < 40 and max(samples) - samples[0] < 160, (settled, samples)
    await legit.still_served(target.ctl.http)

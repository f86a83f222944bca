"""The real gRPC server in-process: a digest mismatch, the re-sync it causes, and bad digests."""

import asyncio

import grpc
import httpx
import pytest

from protos import controller_pb2 as pb

from .conftest import quorum_request, samples

REPLICAS = ("r0", "r1", "r2")
GOOD, BAD = "5eed" * 16, "bad0" * 16


async def round_(stub, step, known=0):
    answers = await asyncio.gather(*(stub.Quorum(quorum_request(r, step, known_quorum_id=known), timeout=10)
                                     for r in REPLICAS))
    assert len({a.quorum_id for a in answers}) == 1
    return answers[0]


async def commit(stub, rid, step, quorum_id, digest="", caught_up=False):
    await stub.ReportStep(pb.ReportStepRequest(job_id="t", replica_id=rid, step=step, quorum_id=quorum_id,
                                               digest=digest, caught_up=caught_up))


async def test_mismatch_then_resync_then_healthy(server, stub):
    q0 = await round_(stub, 0)
    for rid in REPLICAS:
        await commit(stub, rid, 0, q0.quorum_id, BAD if rid == "r1" else GOOD)

    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reps = {r["replica_id"]: r for r in (await http.get("/api/v1/replicas")).json()}
        assert reps["r1"]["state"] == "DIVERGED" and reps["r1"]["diverged"]
        assert (reps["r1"]["digest"], reps["r1"]["digest_step"]) == (BAD, 0)
        assert not reps["r0"]["diverged"] and reps["r0"]["digest"] == GOOD
        assert (await http.get("/api/v1/job")).json()["digest_mismatches"] == 1
        [event] = [e for e in (await http.get("/api/v1/events")).json() if e["kind"] == "digest_mismatch"]
        assert f"r0, r2 hold {GOOD}" in event["message"] and f"r1 holds {BAD}" in event["message"]
        assert samples((await http.get("/metrics")).text)[("fthsdp_digest_mismatches_total", ())] == 1

    heal = await round_(stub, 1, known=q0.quorum_id)
    assert heal.quorum_id == q0.quorum_id + 1 and heal.addresses_included  # new rings
    assert {m.replica_id: m.healthy for m in heal.members} == {"r0": True, "r1": False, "r2": True}
    assert [(r.replica_id, list(r.sources_by_shard)) for r in heal.recover] == [("r1", ["r0", "r2"])]
    for rid in ("r0", "r2"):
        await commit(stub, rid, 1, heal.quorum_id, GOOD)
    await commit(stub, "r1", 1, heal.quorum_id, GOOD, caught_up=True)
    r1 = server.state.replicas["r1"]
    assert r1.state.value == "HEALTHY" and r1.reason == "re-synced from r0, r2 and committed step 1"

    steady = await round_(stub, 2, known=heal.quorum_id)
    assert steady.quorum_id == heal.quorum_id and not steady.addresses_included
    assert all(m.healthy for m in steady.members) and steady.reason.startswith("fast path")


@pytest.mark.parametrize("digest, text", [
    ("ab" * 1000, "is 2000 characters; it must be 8..128 hex digits"),
    ("zz" * 16, "is not hexadecimal"),
    ("12ab", "is 4 characters"),
])
async def test_bad_digests_are_refused_and_change_nothing(server, stub, digest, text):
    q0 = await round_(stub, 0)
    before = server.state.snapshot_replicas()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await commit(stub, "r0", 0, q0.quorum_id, digest)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in err.value.details()
    assert server.state.snapshot_replicas() == before and len(server.state.digest_ledger) == 0

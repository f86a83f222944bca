"""/api/v1/stalls and the hosts' reasons through the real REST server, on the test's clock:
the stall the survivors stood through after a failure, beside the failure's own recovery."""

import httpx
import pytest

from controller.core.commands import (
    CloseRound, Cordon, DeregisterAgent, Join, RegisterAgent, ReportReplicaDead, ReportStep,
)
from controller.core.model import JoinRequest
from protos import controller_pb2 as pb


async def train(server, replicas, steps, clock, every_s=0.1):
    """One quorum of `replicas`, then `steps` committed steps, one every `every_s` (by commands)."""
    s = server.state
    before = s.quorum
    for rid in replicas:
        await server.apply(Join(JoinRequest(rid, s.replicas[rid].step if rid in s.replicas else 0, 1)))
    await server.apply(CloseRound())
    assert s.quorum is not None and s.quorum is not before  # formed (by this look, or the ticker's)
    for _ in range(steps):
        clock.advance(every_s)
        for rid in replicas:
            r = s.replicas[rid]
            await server.apply(ReportStep(rid, r.given_step, quorum_id=r.given_quorum_id, step_time_s=every_s))
            await server.apply(Join(JoinRequest(rid, r.step, 1)))
        await server.apply(CloseRound())


async def test_stalls_show_how_long_the_survivors_stood_still(server, clock):
    s = server.state
    t0 = clock.now
    await train(server, ["r0", "r1", "r2"], 20, clock)  # steps 0..19 by t0+2.0
    clock.advance(1.0)
    await server.apply(ReportReplicaDead("r2", "GPU fell off the bus"))  # declared at t0+3.0
    clock.advance(6.9)  # the survivors stand still until t0+9.9
    await train(server, ["r0", "r1"], 5, clock)  # they commit again from t0+10.0
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        body = (await http.get("/api/v1/stalls")).json()
        spec = (await http.get("/openapi.json")).json()
    assert body["typical_step_s"] == pytest.approx(0.1, rel=0.1)
    (stall,) = body["stalls"]
    assert (stall["start"] - t0, stall["end"] - t0) == (pytest.approx(2.0), pytest.approx(10.0))
    assert stall["seconds"] == pytest.approx(8.0) and not stall["ongoing"] and stall["step"] == 19
    assert [f["replica"] for f in stall["failures"]] == ["r2"]
    assert stall["quorum_id"] == s.quorum.quorum_id and stall["quorum_reason"] == "all 2 live replicas joined"
    (failure,) = body["failures"]
    assert failure["replica"] == "r2" and failure["recover_s"] is None
    assert failure["stall"]["seconds"] == pytest.approx(8.0)
    schema = spec["paths"]["/api/v1/stalls"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/StallsView")
    assert {"stalls", "failures", "typical_step_s"} <= set(spec["components"]["schemas"]["StallsView"]["properties"])


async def test_a_stall_is_ongoing_while_the_job_stands_still(server, clock):
    await train(server, ["r0", "r1", "r2"], 10, clock)
    clock.advance(5.0)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        (stall,) = (await http.get("/api/v1/stalls")).json()["stalls"]
    assert stall["ongoing"] and stall["seconds"] == pytest.approx(5.0)


async def test_hosts_say_why_they_are_dead_or_cordoned(server, stub, clock):
    for host in ("h0", "h1", "h2"):
        await server.apply(RegisterAgent(host, f"{host}-1", spare=True))
    await stub.RegisterAgent(pb.RegisterAgentRequest(host_id="h3", incarnation="h3-1", spare=True, standby=True))
    await server.apply(DeregisterAgent("h1", "h1-1", "node drained for a kernel upgrade"))
    await server.apply(Cordon("h2", "flaky NIC"))
    clock.advance(2.5)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        hosts = {h["host_id"]: h for h in (await http.get("/api/v1/hosts")).json()}
    assert hosts["h1"]["state"] == "DEAD"
    assert hosts["h1"]["state_reason"] == "host h1 left: its agent stopped: node drained for a kernel upgrade"
    assert hosts["h2"]["cordoned"] and hosts["h2"]["cordoned_by"] == "admin" and hosts["h2"]["cordon_reason"] == "flaky NIC"
    assert hosts["h0"]["state"] == "SPARE" and not hosts["h0"]["cordoned"] and hosts["h0"]["seconds_since_seen"] == 2.5
    assert hosts["h0"]["state_reason"] == hosts["h2"]["state_reason"] == ""  # only a DEAD host has one
    assert hosts["h3"]["standby"] and hosts["h3"]["spare"] and not hosts["h0"]["standby"]  # as its agent said

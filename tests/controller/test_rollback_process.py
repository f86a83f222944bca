"""Rollback over the wire: a real controller process, simulated replica leaders on real gRPC.
A round that would go back in history waits for the replica that holds the newest step;
when it returns in time nothing is lost; when it does not, the rollback is an event, and
its later return rolls the job forward, loudly too (events, /metrics)."""

import asyncio
import json

import grpc
import httpx
import pytest

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from tests.waiting import wait_for_async

pytestmark = pytest.mark.slow
WAIT_S = 4.0  # rollback_wait_s: long enough for a loaded machine, short for the suite


class Leaders:
    """Simulated leaders of r0..r2; a heartbeat stream keeps the `beating` ones alive."""

    def __init__(self, stub, http: str) -> None:
        self.stub, self.http = stub, http
        self.beating = {"r0", "r1", "r2"}
        self.incarnations = {"r0": "a", "r1": "a", "r2": "a"}

    async def heartbeats(self, stop: asyncio.Event):
        async def beats():
            while not stop.is_set():
                yield pb.HeartbeatRequest(replica_ids=sorted(self.beating))
                await asyncio.sleep(0.2)
        async for _ in self.stub.Heartbeat(beats()):
            pass

    async def round(self, steps: dict[str, int], first: str = "") -> dict[str, pb.QuorumResponse]:
        """Every replica in `steps` joins (`first` before the others: the controller has it in
        the round before they ask), then each reports the quorum's max_step as committed."""
        def join(rid):
            return asyncio.ensure_future(self.stub.Quorum(pb.QuorumRequest(
                job_id="t", replica_id=rid, step=steps[rid], world_size=1, incarnation=self.incarnations[rid]),
                timeout=30))
        calls = {}
        if first:
            calls[first] = join(first)
            await wait_for_async(lambda: self.joined(first), 10, f"{first} in the round")
        calls.update({rid: join(rid) for rid in steps if rid != first})
        answers = await asyncio.gather(*calls.values())
        steps = dict(zip(calls, (steps[rid] for rid in calls)))
        for rid, q in zip(steps, answers):
            await self.stub.ReportStep(pb.ReportStepRequest(job_id="t", replica_id=rid, step=q.max_step,
                                                            quorum_id=q.quorum_id), timeout=10)
        return dict(zip(steps, answers))

    async def joined(self, rid: str) -> bool:
        async with httpx.AsyncClient(base_url=self.http) as client:
            return rid in (await client.get("/api/v1/job")).json()["round"]["joined"]


async def events(http: str, kind: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=http) as client:
        return [e for e in (await client.get("/api/v1/events?limit=1000")).json() if e["kind"] == kind]


async def test_rollback_waits_for_the_newest_step_and_a_late_return_rolls_forward(controller_process, tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"rollback_wait_s": WAIT_S}))
    ctl = controller_process("--job-id", "t", "--replicas", "3", "--min-replicas", "1", "--join-timeout-s", "0.5",
                             "--heartbeat-timeout-s", "3", "--settings", str(settings))
    async with grpc.aio.insecure_channel(ctl.grpc) as channel:
        leaders = Leaders(pbg.ControllerStub(channel), ctl.http)
        stop = asyncio.Event()
        beating = asyncio.create_task(leaders.heartbeats(stop))
        try:
            for step in range(4):
                await leaders.round({"r0": step, "r1": step, "r2": step})
            # r2 is stopped (it keeps its state, step 3); r0 and r1 restart from scratch.
            leaders.beating.discard("r2")
            leaders.incarnations.update(r0="b", r1="b")
            behind = asyncio.ensure_future(leaders.round({"r0": 0, "r1": 0}))
            waits = await wait_for_event(ctl.http, "rollback_wait")
            assert "r2 (which committed step 3)" in waits[0]["message"]
            assert not behind.done()
            # r2 comes back within the wait: its step wins and nothing is lost.
            leaders.beating.add("r2")
            back = await leaders.round({"r2": 4})
            answers = await behind
            assert back["r2"].max_step == 4 and answers["r0"].max_step == 4
            assert not answers["r0"].HasField("resume_checkpoint_step")
            assert {m.replica_id: m.healthy for m in answers["r0"].members} == {"r0": False, "r1": False, "r2": True}
            assert not await events(ctl.http, "rollback")
            await leaders.round({"r0": 5, "r1": 5, "r2": 5})

            # Again, but r2 stays away past the wait: a rollback, with both steps in its event.
            leaders.beating.discard("r2")
            leaders.incarnations.update(r0="c", r1="c")
            answers = await leaders.round({"r0": 0, "r1": 0})
            assert answers["r0"].max_step == 0 and "ROLLBACK" in answers["r0"].reason
            [rollback] = await events(ctl.http, "rollback")
            assert "the job had committed step 5, training resumes at step 0 (6 committed steps lost" in \
                rollback["message"]
            await leaders.round({"r0": 1, "r1": 1})
            # r2 returns with step 5 committed: its newer state wins over the new history.
            leaders.beating.add("r2")
            answers = await leaders.round({"r0": 2, "r1": 2, "r2": 6}, first="r2")
            assert answers["r2"].max_step == 6
            [forward] = await events(ctl.http, "roll_forward")
            assert "rolls forward from step 1 to step 5: r2 came back with it; 2 steps committed" in forward["message"]
            async with httpx.AsyncClient(base_url=ctl.http) as client:
                metrics = (await client.get("/metrics")).text
                job = (await client.get("/api/v1/job")).json()
            assert 'fthsdp_steps_lost_total{job_id="t",kind="rollback"} 6.0' in metrics
            assert 'fthsdp_steps_lost_total{job_id="t",kind="abandoned"} 2.0' in metrics
            assert 'fthsdp_history_changes_total{job_id="t",kind="rollback"} 1.0' in metrics
            assert 'fthsdp_history_changes_total{job_id="t",kind="roll_forward"} 1.0' in metrics
            assert job["steps_lost"] == {"rollback": 6, "abandoned": 2} and job["history_step"] == 6
        finally:
            stop.set()
            await asyncio.wait_for(beating, 10)


async def wait_for_event(http: str, kind: str) -> list[dict]:
    return await wait_for_async(lambda: events(http, kind), 20, f"a {kind} event")

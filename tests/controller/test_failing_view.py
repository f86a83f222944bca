"""A job that can make no progress, as REST and `fthsdp status` show it before it FAILS: FAILING
with the time left, every replica (joined or not) with its state, counts that agree with the
reason, and a cordoned host that never reads SPARE. In-process controller, fake clock."""

import asyncio
import sys

import httpx
import pytest

from controller.settings import ControllerSettings
from fthsdp.status import job_line, render, step_text
from protos import controller_pb2 as pb
from tests.controller.conftest import samples
from tests.waiting import wait_for_async


@pytest.fixture
def settings():
    return ControllerSettings(job_id="job", replicas=2, min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=50.0,
                              restart_budget=0, fail_after_s=60.0)


async def register(stub, host, replica=None):
    assignment = pb.Assignment(replica_id=replica, ranks=[0], world_size=1) if replica else None
    reply = await stub.RegisterAgent(pb.RegisterAgentRequest(host_id=host, incarnation=f"{host}-1", spare=not replica,
                                                             assignment=assignment))
    return reply.agent_secret


async def crash(stub, secrets, host, replica, tail):
    await stub.ReportTrainerExit(pb.TrainerExitRequest(host_id=host, replica_id=replica, rank=0, exit_code=1,
                                                       stderr_tail=tail, agent_secret=secrets[host]))


async def test_a_stuck_job_shows_failing_every_replica_and_no_cordoned_spare(server, stub, clock):
    secrets = {h: await register(stub, h, r) for h, r in (("h0", "r0"), ("h1", "r1"), ("s0", None))}
    # The trainers die before their first join, each host's budget (0) spent at once: h0's work
    # moves to the spare s0, whose trainer dies too; r1's trainer dies of another cause, so the
    # job waits fail_after_s (a crash loop of one cause would FAIL it at once).
    await crash(stub, secrets, "h0", "r0", "RuntimeError: CUDA error")
    await crash(stub, secrets, "s0", "r0", "RuntimeError: CUDA error")
    await crash(stub, secrets, "h1", "r1", "OSError: disk full")
    stuck_at = clock.now
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        async def failing(left_s):
            j = (await http.get("/api/v1/job")).json()
            return j if j["failing"] and j["fails_in_s"] <= left_s else None

        await wait_for_async(lambda: failing(60.0), 10, "the job to be FAILING", every_s=0.05)
        clock.advance(20.0)
        job = await wait_for_async(lambda: failing(40.0), 10, "20 s less to FAILED", every_s=0.05)
        assert job["job_state"] == "RUNNING" and job["fails_at"] == pytest.approx(stuck_at + 60.0, abs=0.5)
        assert job["fails_in_s"] == pytest.approx(40.0, abs=0.5)
        assert "no replica can make progress: all 2 are DEAD" in job["job_state_reason"]
        replicas = (await http.get("/api/v1/replicas")).json()
        metrics = samples((await http.get("/metrics")).text, "job")
        hosts = {h["host_id"]: h for h in (await http.get("/api/v1/hosts")).json()}
    # every configured replica, with its state, though none ever joined
    assert [(r["replica_id"], r["state"]) for r in replicas] == [("r0", "DEAD"), ("r1", "DEAD")]
    assert "never joined: its trainers died (exit code 1: OSError: disk full); host h1 cannot run" in replicas[1]["reason"]
    assert (job["replicas_dead"], job["replicas_known"], job["replicas_total"]) == (2, 2, 2)
    assert metrics[("fthsdp_replicas", (("state", "DEAD"),))] == 2  # the metric counts the same rows
    # h0 gave its work to s0 and is cordoned: out of the pool, not a spare; h1 waits for one
    assert hosts["h0"]["state"] == "CORDONED" and not hosts["h0"]["spare"] and hosts["h0"]["cordoned"]
    assert hosts["h1"]["state"] == "CORDONED" and hosts["h1"]["assignment"]["replica_id"] == "r1"
    assert job["spares_free"] == 0

    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "fthsdp.cli", "status", "--url", server.http_url,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    text = out.decode()
    assert text.splitlines()[0].startswith('job "job" FAILING (FAILED in ')
    assert "0 healthy / 0 behind / 0 joining / 0 diverged / 0 finished / 2 dead of 2  spares free 0" in text
    assert "FAILING: no replica can make progress: all 2 are DEAD" in text
    rows = {line.split()[0]: line.split()[1] for line in text.splitlines() if line[:2] in ("r0", "r1", "h0", "s0")}
    assert rows == {"r0": "DEAD", "r1": "DEAD", "h0": "CORDONED", "s0": "CORDONED"}  # s0 waits for a spare


JOB = {"job_id": "job", "job_state": "RUNNING", "leader": "c1", "quorum_id": 0, "max_step": 0, "lr_scale": 1.0,
       "failing": False, "fails_in_s": None}


@pytest.mark.parametrize("job, line", [
    (JOB, 'job "job" RUNNING  leader c1  no quorum yet'),
    ({**JOB, "quorum_id": 17, "max_step": 400}, 'job "job" RUNNING  leader c1  quorum 17 trains step 400  lr_scale 1.000'),
    ({**JOB, "failing": True, "fails_in_s": 12.4},
     'job "job" FAILING (FAILED in 12s)  leader c1  no quorum yet'),
    ({**JOB, "job_state": "COMPLETED", "job_id": "my job"}, 'job "my job" COMPLETED  leader c1  no quorum yet'),
])
def test_the_job_line_reads_well_with_any_id_and_says_which_step(job, line):
    assert job_line(job) == line


def test_step_numbers_and_counts_are_labelled_for_what_they_count():
    assert (step_text(-1), step_text(0), step_text(399)) == ("none yet", "0", "399")
    job = {**JOB, "quorum_id": 17, "max_step": 400, "replicas_total": 3, "replicas_known": 2, "replicas_healthy": 2,
           "replicas_behind": 0, "replicas_joining": 0, "replicas_diverged": 0, "replicas_finished": 0,
           "replicas_dead": 0, "spares_free": 1, "swaps": 0, "steps_committed": 664, "digest_mismatches": 0,
           "committed_step": 399, "round": {"reason": "fast path"}, "job_state_reason": "",
           "goodput": {"effective_training_ratio": 0.9, "wall_s": 100, "committed_steps_per_s": 4.0}}
    text = render(job, [], [], {}, [])
    assert "replica commits 664" in text and "steps committed" not in text  # commit reports, not a step
    assert "committed step 399" in text and "trains step 400" in text
    assert "0 dead of 3 (1 not seen yet)" in text

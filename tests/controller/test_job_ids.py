"""A job id is never reused silently (controller/core/job_ids.py): the choice as a table, then
real controller processes on the session's real etcd, a job driven to COMPLETED through gRPC,
a second controller with the same flags refused, one with --new-job serving the next id."""

from __future__ import annotations

import subprocess
import sys
import uuid

import grpc
import httpx
import pytest

from controller.core.job_ids import MAX_CANDIDATES, Ending, JobIdChoice, candidates, choose_job_id, ending_of
from controller.launch import launch
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg

from tests.waiting import wait_for_blocking

from .conftest import quorum_request

DONE = Ending("COMPLETED", "every replica finished")
FAILED = Ending("FAILED", "no replica could make progress for 300 s")


@pytest.mark.parametrize("endings, new_job, expected", [
    ([None], False, JobIdChoice("j", "job 'j' is not finished in the store: this controller serves it")),
    ([None], True, JobIdChoice("j", "job 'j' is not finished in the store: this controller serves it")),
    ([DONE], False, JobIdChoice("", "the store holds job 'j' COMPLETED (every replica finished); a job id is never "
                                    "reused: give a fresh --job-id for a new job, or --new-job to start the next "
                                    "free id (j-2, ...)")),
    ([FAILED], False, JobIdChoice("", "the store holds job 'j' FAILED (no replica could make progress for 300 s); a "
                                      "job id is never reused: give a fresh --job-id for a new job, or --new-job to "
                                      "start the next free id (j-2, ...)")),
    ([DONE, None], True, JobIdChoice("j-2", "the store holds job 'j' COMPLETED (every replica finished); --new-job: "
                                            "this controller serves job 'j-2'")),
    ([FAILED, DONE, None], True, JobIdChoice("j-3", "the store holds job 'j' FAILED (no replica could make progress "
                                                    "for 300 s); --new-job: this controller serves job 'j-3'")),
    ([DONE, DONE], True, JobIdChoice("", "the store holds job 'j' COMPLETED (every replica finished), and so are "
                                         "the next 1 ids (j-2 .. j-2): give a fresh --job-id")),
])
def test_the_choice(endings, new_job, expected):
    assert choose_job_id("j", endings, new_job) == expected


def test_endings_and_candidates():
    assert ending_of(None) is None and ending_of({}) is None
    assert ending_of({"completed_at": None, "failed_at": None, "replicas": []}) is None
    assert ending_of({"completed_at": 5.0, "job_end_reason": "done"}) == Ending("COMPLETED", "done")
    assert ending_of({"failed_at": 0.0, "job_end_reason": ""}) == Ending("FAILED", "no reason recorded")
    assert candidates("llm", 3) == ["llm", "llm-2", "llm-3"] and len(candidates("x")) == MAX_CANDIDATES


async def _leading(ctl) -> dict:
    """The job view, once this controller leads."""
    await wait_for_blocking(lambda: httpx.get(f"{ctl.http}/healthz", timeout=10).json()["leading"], 60,
                            "the controller leads")
    return httpx.get(f"{ctl.http}/api/v1/job", timeout=10).json()


async def _complete(ctl) -> None:
    """Drive a one-replica job to COMPLETED as its agent and coordinator would."""
    await _leading(ctl)
    async with grpc.aio.insecure_channel(ctl.grpc) as channel:
        stub = pbg.ControllerStub(channel)
        await stub.RegisterAgent(pb.RegisterAgentRequest(
            host_id="h0", incarnation="h0-1", assignment=pb.Assignment(replica_id="r0", ranks=[0], world_size=1)))
        join = quorum_request("r0", 0, world=1, incarnation="one", host_id="h0")
        join.job_id = ""  # the controller's, whichever it is
        q = await stub.Quorum(join, timeout=30)
        await stub.ReportStep(pb.ReportStepRequest(replica_id="r0", step=0, host_id="h0", quorum_id=q.quorum_id))
        reply = await stub.ReportFinished(pb.ReportFinishedRequest(replica_id="r0", step=0, host_id="h0",
                                                                   reason="max_steps reached"))
        assert reply.job_state == pb.COMPLETED


def _flags(etcd, job_id: str) -> list[str]:
    return ["--etcd", etcd.endpoint, "--job-id", job_id, "--replicas", "1", "--lease-ttl-s", "1", "--event-log", "off"]


@pytest.mark.etcd
async def test_a_finished_job_id_is_refused_and_new_job_serves_the_next(etcd, tmp_path):
    job = f"reuse-{uuid.uuid4().hex[:8]}"  # the session's etcd is shared: a prefix of our own
    first = launch(*_flags(etcd, job), insecure=True)
    try:
        await _complete(first)
    finally:
        first.stop()

    # The same flags again: refused, naming the id and its state; nothing serves.
    again = subprocess.run([sys.executable, "-m", "controller.main", "--grpc-port", "0", "--http-port", "0",
                            "--insecure", *_flags(etcd, job)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stdout == "", again
    assert f"fthsdp controller: the store holds job {job!r} COMPLETED (" in again.stderr, again.stderr
    assert "); a job id is never reused: give a fresh --job-id" in again.stderr

    # --new-job: the next id, a new job from step 0, and the old one untouched.
    fresh = launch(*_flags(etcd, job), "--new-job", insecure=True)
    try:
        view = await _leading(fresh)
        assert view["job_id"] == f"{job}-2" and view["job_state"] == "RUNNING" and view["committed_step"] in (-1, 0, None)
        async with grpc.aio.insecure_channel(fresh.grpc) as channel:
            reply = await pbg.ControllerStub(channel).RegisterAgent(pb.RegisterAgentRequest(
                host_id="h9", incarnation="h9-1", spare=True))
        assert reply.job_state == pb.RUNNING and reply.job_id == f"{job}-2"
    finally:
        fresh.stop()
    # A standby of the new job, started with the same flags, serves the same id.
    standby = launch(*_flags(etcd, job), "--new-job", insecure=True)
    try:
        view = await _leading(standby)
        assert view["job_id"] == f"{job}-2"
    finally:
        standby.stop()

"""A job without a durable checkpoint is said to be one (issue 39, finding 8): once in the log,
in REST /api/v1/job, and (tests/ui) on the status page. Replicas tell the controller how often
they checkpoint in every join (QuorumRequest.checkpoint_every_steps)."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from tests.waiting import wait_until

WARNING = "a failure of every replica restarts from step 0"


def _join(stub, rid: str, step: int = 0, every: int = 0) -> pb.QuorumResponse:
    return stub.Quorum(pb.QuorumRequest(job_id="ck", replica_id=rid, step=step, world_size=1,
                                        checkpoint_every_steps=every), timeout=30)


def _job(ctl) -> dict:
    return httpx.get(f"{ctl.http}/api/v1/job", timeout=10).json()


def _no_checkpoint_lines(log) -> list[dict]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [e for e in lines if e["kind"] == "no_checkpoint"]


def test_a_job_without_a_checkpoint_says_so_once_and_in_rest(controller_process, tmp_path):
    log = tmp_path / "controller.err"
    with open(log, "w") as err:
        ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--job-id", "ck", stderr=err)
    assert _job(ctl)["durable_checkpoint"] is None  # nobody joined: not known yet
    with grpc.insecure_channel(ctl.grpc) as channel:
        stub = pbg.ControllerStub(channel)
        first = _join(stub, "r0")
        stub.ReportStep(pb.ReportStepRequest(job_id="ck", replica_id="r0", step=0, quorum_id=first.quorum_id),
                        timeout=10)
        _join(stub, "r0", step=1)  # joins again: said once, not per join
    job = _job(ctl)
    assert job["durable_checkpoint"] is False and job["checkpoint_warning"] == f"no durable checkpoint: {WARNING}"
    replica = httpx.get(f"{ctl.http}/api/v1/replicas", timeout=10).json()[0]
    assert replica["checkpoint_every_steps"] == 0
    [event] = wait_until(lambda: _no_checkpoint_lines(log) or None, 10, "the no_checkpoint log line")
    assert event["level"] == "warning" and WARNING in event["message"] and "replica r0" in event["message"]
    assert len(_no_checkpoint_lines(log)) == 1


def test_a_job_whose_replicas_checkpoint_says_nothing(controller_process):
    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--job-id", "ck")
    with grpc.insecure_channel(ctl.grpc) as channel:
        _join(pbg.ControllerStub(channel), "r0", every=50)
    job = _job(ctl)
    assert job["durable_checkpoint"] is True and job["checkpoint_warning"] == ""
    events = httpx.get(f"{ctl.http}/api/v1/events", timeout=10).json()
    assert events and not [e for e in events if e["kind"] == "no_checkpoint"]


def test_a_negative_checkpoint_period_is_refused(controller_process):
    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--job-id", "ck")
    with grpc.insecure_channel(ctl.grpc) as channel, pytest.raises(grpc.RpcError) as refused:
        _join(pbg.ControllerStub(channel), "r0", every=-5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "checkpoint_every_steps must be 0..2147483647, got -5" in refused.value.details()
    assert _job(ctl)["durable_checkpoint"] is None

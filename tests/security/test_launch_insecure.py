"""controller.launch never starts an --insecure controller silently: without a job secret the
caller says insecure=True, or a WARNING names what the controller will not check; insecure=False
without a secret is refused before any process starts. Real controller processes."""

from __future__ import annotations

import logging
import os

import grpc
import pytest

from controller.launch import launch
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos import job_secret

FLAGS = ("--replicas", "1", "--min-replicas", "1", "--log-level", "WARNING")


def _env(secret: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (job_secret.ENV_JOB_SECRET, job_secret.ENV_JOB_SECRET_FILE)}
    return {**env, job_secret.ENV_JOB_SECRET: secret} if secret else env


def _register_without_proof(ctl) -> grpc.StatusCode:
    """A stranger's registration (no proof): OK from an --insecure controller only."""
    with grpc.insecure_channel(ctl.grpc) as channel:
        try:
            pbg.ControllerStub(channel).RegisterAgent(pb.RegisterAgentRequest(host_id="h9", incarnation="x",
                                                                              spare=True), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _launch_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "fthsdp.launch"]


@pytest.mark.parametrize("insecure", (None, True), ids=("not-said", "asked"))
def test_without_a_secret_the_controller_is_insecure_and_says_so_unless_asked(caplog, insecure):
    caplog.set_level(logging.INFO, logger="fthsdp.launch")
    ctl = launch(*FLAGS, env=_env(), insecure=insecure)
    try:
        assert _register_without_proof(ctl) == grpc.StatusCode.OK
    finally:
        ctl.stop()
    [record] = _launch_records(caplog)
    if insecure is None:
        assert record.levelno == logging.WARNING
        for unchecked in ("--insecure", "registration proofs", "agent secrets on heartbeats", "coordinator credentials",
                          "pass insecure=True"):
            assert unchecked in record.getMessage(), record.getMessage()
    else:
        assert record.levelno == logging.INFO and "--insecure" in record.getMessage()


def test_with_a_secret_nothing_is_said_and_a_stranger_is_refused(caplog):
    caplog.set_level(logging.INFO, logger="fthsdp.launch")
    ctl = launch(*FLAGS, env=_env(job_secret.generate()))
    try:
        assert _register_without_proof(ctl) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        ctl.stop()
    assert _launch_records(caplog) == []


def test_insecure_false_without_a_secret_is_refused_before_a_process_starts():
    with pytest.raises(ValueError, match=r"insecure=False\) without a job secret: give --job-secret-file"):
        launch(*FLAGS, env=_env(), insecure=False, timeout_s=0.001)  # nothing to wait for


def test_insecure_true_with_a_secret_is_a_contradiction():
    with pytest.raises(ValueError, match=r"insecure=True\) with a job secret"):
        launch(*FLAGS, env=_env(job_secret.generate()), insecure=True, timeout_s=0.001)

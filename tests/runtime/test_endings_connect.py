"""Scenario 7 of issue 26, the trainer's side: a trainer given a wrong controller address logs
every failed attempt with its backoff and gives up after connect_timeout_s
(FTHSDP_CONNECT_TIMEOUT_S), exiting non-zero with a Fatal error that names the setting,
instead of retrying for ever. The rule on a fake clock, then examples/train_gpt.py as users run it."""

from __future__ import annotations

import socket
import subprocess

import pytest

from fthsdp.settings import RuntimeSettings
from fthsdp.step.controller_client import Outage
from tests.runtime.cluster import PYTHON, REPO
from tests.runtime.test_cluster_endings import base_env

BOUND_S = 120


def test_the_outage_rule_gives_up_when_the_next_pause_would_pass_the_limit():
    o = Outage(10.0)
    assert not o.failed(100.0, 1.0) and o.attempts == 1 and o.length(104.0) == 4.0
    assert not o.failed(108.0, 2.0)  # 8 s without an answer, next try at 10 s: still within
    assert o.failed(109.5, 1.0) and o.attempts == 3  # the next try would be at 10.5 s
    o.succeeded()  # an answer: a new outage starts from nothing
    assert o.length(200.0) == 0.0 and not o.failed(200.0, 9.0) and o.attempts == 1


def test_the_connect_timeout_comes_from_the_environment_and_is_checked():
    assert RuntimeSettings.from_env({"FTHSDP_CONNECT_TIMEOUT_S": "2.5", "FTHSDP_CONTROLLER": "a:1"},
                                    insecure_trainer_ports=True).connect_timeout_s == 2.5
    assert RuntimeSettings(controller_address="a:1", insecure_trainer_ports=True).connect_timeout_s == 300.0
    with pytest.raises(ValueError, match=r"FTHSDP_CONNECT_TIMEOUT_S='soon' is not a number of seconds"):
        RuntimeSettings.from_env({"FTHSDP_CONNECT_TIMEOUT_S": "soon"})
    with pytest.raises(ValueError, match=r"connect_timeout_s must be a finite number of seconds > 0, got 0"):
        RuntimeSettings(controller_address="a:1", insecure_trainer_ports=True, connect_timeout_s=0).validate()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_trainer_with_a_wrong_controller_address_logs_each_attempt_and_gives_up(tmp_path):
    with socket.socket() as closed:  # bound, never listening: every connection is refused
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        run = subprocess.run(
            [PYTHON, "examples/train_gpt.py", "--checkpoint-dir", "",
             "--steps", "2", "--cpu", "--out", str(tmp_path)], cwd=REPO,
            env={**base_env(None), "FTHSDP_CONTROLLER": address, "FTHSDP_REPLICA_ID": "r0",
                 "FTHSDP_CONNECT_TIMEOUT_S": "3"},
            capture_output=True, text=True, timeout=BOUND_S)
    assert run.returncode != 0, run.stderr[-3000:]
    attempts = [line for line in run.stderr.splitlines() if f"replica r0: controller {address} failed Quorum" in line]
    assert len(attempts) >= 2, run.stderr[-3000:]
    assert "UNAVAILABLE" in attempts[0] and "attempt 1; trying" in attempts[0] and "attempt 2; trying" in attempts[1]
    assert "(giving up after 3 s without an answer)" in attempts[0]
    assert "fthsdp.errors.Fatal: " in run.stderr or "ControllerUnreachable" in run.stderr, run.stderr[-3000:]
    assert "no controller answered for" in run.stderr
    assert "giving up (connect_timeout_s 3, FTHSDP_CONNECT_TIMEOUT_S)" in run.stderr
    assert not list(tmp_path.iterdir())  # trained nothing, wrote nothing

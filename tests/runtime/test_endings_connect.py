"""Scenario 7 of issue 26 and finding 5 of issue 39, the trainer's side: a trainer given a wrong
controller address logs its failed attempts (once per doubling of their count, each with the
address and the reason) and gives up after connect_timeout_s (FTHSDP_CONNECT_TIMEOUT_S, short:
it never had an answer), exiting non-zero with a Fatal error that names the setting, instead of
retrying for ever. The rule on a fake clock is in tests/test_dial_outage.py; here the settings,
then examples/train_gpt.py (forked from the session's pre-imported server, tests/forked.py)."""

from __future__ import annotations


import pytest

from fthsdp.settings import RuntimeSettings
from tests.runtime.test_cluster_endings import base_env, example
from tests.sockets import refused_address

BOUND_S = 120


def test_the_connect_timeout_comes_from_the_environment_and_is_checked():
    assert RuntimeSettings.from_env({"FTHSDP_CONNECT_TIMEOUT_S": "2.5", "FTHSDP_CONTROLLER": "a:1"},
                                    insecure_trainer_ports=True).connect_timeout_s == 2.5
    defaults = RuntimeSettings(controller_address="a:1", insecure_trainer_ports=True)
    assert (defaults.connect_timeout_s, defaults.reconnect_timeout_s) == (60.0, 300.0)  # short only for a first one
    assert RuntimeSettings.from_env({"FTHSDP_RECONNECT_TIMEOUT_S": "900", "FTHSDP_CONTROLLER": "a:1"},
                                    insecure_trainer_ports=True).reconnect_timeout_s == 900.0
    with pytest.raises(ValueError, match=r"FTHSDP_CONNECT_TIMEOUT_S='soon' is not a number of seconds"):
        RuntimeSettings.from_env({"FTHSDP_CONNECT_TIMEOUT_S": "soon"})
    with pytest.raises(ValueError, match=r"connect_timeout_s must be a finite number of seconds > 0, got 0"):
        RuntimeSettings(controller_address="a:1", insecure_trainer_ports=True, connect_timeout_s=0).validate()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_trainer_with_a_wrong_controller_address_logs_each_attempt_and_gives_up(tmp_path):
    address = refused_address()
    out = tmp_path / "out"
    out.mkdir()
    code, stderr = example(tmp_path / "trainer.log", {**base_env(None), "FTHSDP_CONTROLLER": address,
                                                      "FTHSDP_REPLICA_ID": "r0", "FTHSDP_CONNECT_TIMEOUT_S": "3"},
                           "--checkpoint-dir", "", "--steps", "2", "--cpu", "--out", str(out))
    assert code != 0, stderr[-3000:]
    attempts = [line for line in stderr.splitlines() if f"replica r0: controller {address} failed Quorum" in line]
    assert len(attempts) >= 2, stderr[-3000:]
    assert "UNAVAILABLE" in attempts[0] and "attempt 1; trying" in attempts[0] and "attempt 2; trying" in attempts[1]
    assert "(giving up after 3 s without an answer, FTHSDP_CONNECT_TIMEOUT_S)" in attempts[0]
    made = int(stderr.split("no controller answered for ")[1].split("(")[1].split(" attempt")[0])
    assert made > len(attempts) and len(attempts) <= made.bit_length()  # once per doubling, not per attempt
    assert "fthsdp.errors.Fatal: " in stderr or "ControllerUnreachable" in stderr, stderr[-3000:]
    assert "no controller answered for" in stderr
    assert "giving up (connect_timeout_s 3, FTHSDP_CONNECT_TIMEOUT_S)" in stderr
    assert not list(out.iterdir())  # trained nothing, wrote nothing

"""Configuration errors end a replica with their own exit status (issue 39, finding 5): no job
secret, a job secret that differs from the controller's, a job the controller does not run.
torchrun restarts every non-zero exit up to --max-restarts; these exit EXIT_CONFIGURATION_ERROR
(78), which a restart cannot fix and the docs tell torchrun users not to restart on, distinct
from a crash (1) and from a start after the job COMPLETED (3).

Real processes: a controller holding the session's job secret, and one-rank replicas
(tests/runtime/end_worker.py, which exits with `fthsdp.exit_status`), forked from the test
session's pre-imported server (tests/forked.py)."""

from __future__ import annotations

import os

import pytest

from fthsdp import EXIT_CONFIGURATION_ERROR, ConfigurationError
from fthsdp.errors import ControllerRefusedConfiguration, InvalidSettings, exit_status
from fthsdp.settings import RuntimeSettings
from fthsdp.step import coordination as co
from fthsdp.step.controller_client import ControllerClient
from protos import job_secret
from tests import forked, trainer_secret
from tests.runtime.cluster import REPO
from tests.runtime.test_cluster_endings import base_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BOUND_S = 240


@pytest.fixture
def controller(controller_process):
    return controller_process("--replicas", "1", "--min-replicas", "1", "--job-id", "t",
                              env={**os.environ, **trainer_secret.ENV})


def test_configuration_errors_are_their_own_kind_with_their_own_exit_status():
    with pytest.raises(InvalidSettings, match="The trainer ports need the job secret") as err:
        RuntimeSettings.from_env({"FTHSDP_CONTROLLER": "a:1"})
    assert isinstance(err.value, ValueError) and isinstance(err.value, ConfigurationError)
    assert exit_status(err.value) == EXIT_CONFIGURATION_ERROR == 78
    assert exit_status(RuntimeError("a crash")) == 1


def test_the_controllers_refusals_of_who_a_replica_is_are_configuration_errors(controller):
    request = co.RequestQuorum(0, 0, ("127.0.0.1:1",), ("127.0.0.1:2",))
    other = job_secret.parse(job_secret.generate(), "another job's secret")
    for job, secret, words in (("t", other, "the job secret differs from the controller's"),
                               ("another-job", trainer_secret.SECRET, "does not match this controller's job")):
        client = ControllerClient(controller.grpc, job, "r0", "inc-1", job_secret=secret)
        try:
            with pytest.raises(ControllerRefusedConfiguration, match=words) as err:
                client.quorum(request, 1, "", timeout_s=20)
            assert exit_status(err.value) == EXIT_CONFIGURATION_ERROR
        finally:
            client.close()


def test_a_replica_without_a_secret_or_with_another_one_exits_78(controller, tmp_path):
    env = {**base_env(None), "FTHSDP_CONTROLLER": controller.grpc, "FTHSDP_REPLICA_ID": "r0", "FTHSDP_JOB_ID": "t"}
    no_secret = {k: v for k, v in env.items() if not k.startswith("FTHSDP_JOB_SECRET")}
    wrong = {**env, job_secret.ENV_JOB_SECRET: job_secret.generate()}
    logs = [tmp_path / "no-secret.log", tmp_path / "wrong.log"]
    runs = [forked.start("tests.runtime.end_worker", ["3"], log=log, env=e, cwd=REPO, pipes=False)
            for log, e in zip(logs, (no_secret, wrong))]
    codes = [p.wait(BOUND_S) for p in runs]
    none_err, wrong_err = [log.read_text() for log in logs]
    assert codes == [EXIT_CONFIGURATION_ERROR] * 2, (none_err[-2000:], wrong_err[-2000:])
    assert "The trainer ports need the job secret" in none_err
    assert "ConfigurationError" in wrong_err and "the job secret differs from the controller's" in wrong_err

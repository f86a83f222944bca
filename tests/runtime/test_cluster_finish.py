"""Real processes against the controller's half of the contract: digests that disagree are
noticed and healed by a catch-up; a job whose replicas finished is COMPLETED, and a
replica that starts after it learns so before training (JobAlreadyCompleted)."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
import torch

from fthsdp import Manager, RuntimeSettings
from fthsdp.errors import JobAlreadyCompleted, JobCompleted
from fthsdp.step import coordination as co
from fthsdp.step.controller_client import ControllerClient
from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster, Faults, start_controller
from tests.trainer_secret import SECRET

pytestmark = pytest.mark.slow


def test_a_corrupted_replica_is_found_by_its_digest_and_healed_by_catch_up(tmp_path):
    cluster = Cluster(tmp_path, replicas=2, ranks=1, steps=12, join_timeout_s=0.5,
                      worker={"digest_every": 2}, faults=Faults().corrupt(replica=1, after_step=3))
    rec = cluster.run(timeout_s=100.0)
    (corrupted,) = rec.where(event="corrupted")
    events = (tmp_path / "controller.log").read_text()
    assert "replica 1 became DIVERGED: its digest at step 5" in events  # the first digest after the flip
    # digests after steps 3 (before the flip), 5, 7 ...: the one of step 5 disagrees; replica 1 (outside
    # the group holding the lowest replica id) is marked DIVERGED and re-synced from replica 0
    healed = [r for r in rec.where(event="commit", replica="1", behind=True) if r["step"] > corrupted["step"]]
    assert healed, "replica 1 never caught up after its weights were corrupted"
    after = healed[0]["step"]
    for step, rows in hc.committed_steps(rec).items():
        if step >= after:
            assert len({r["digest"] for r in rows}) == 1, f"step {step} still differs after the catch-up"
    done = rec.where(event="done")
    assert len({r["step"] for r in done}) == 1


def test_a_finished_job_is_completed_and_a_late_replica_ends_without_training(tmp_path):
    ctl = start_controller(tmp_path / "controller.log", replicas=1, join_timeout_s=0.2, heartbeat_timeout_s=3.0)
    try:
        settings = RuntimeSettings(job_id="t", replica_id="0", controller_address=ctl.grpc, max_steps=2,
                                   quorum_timeout_s=20.0, job_secret=SECRET)
        for replica in ("0", "1"):  # "1" comes after the job completed
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            manager = Manager(model, opt, dataclasses.replace(settings, replica_id=replica)).start()
            trained = 0
            if replica == "0":
                for x in manager.batches(lambda r, p: torch.ones(2, 4)):
                    model(x).sum().backward()
                    trained += manager.end_step()
                manager.close()
                assert trained == 2 and manager.finished
            else:  # it learns so before training, and does not end as if it had trained
                with pytest.raises(JobAlreadyCompleted, match="started after the job COMPLETED"):
                    for x in manager.batches(lambda r, p: torch.ones(2, 4)):
                        trained += 1
                manager.close()
                assert trained == 0 and manager.last_outcome is None
            job = httpx.get(f"{ctl.http}/api/v1/job", timeout=5.0).json()
            assert job["job_state"] == "COMPLETED", job
            replicas = {r["replica_id"]: r["state"] for r in httpx.get(f"{ctl.http}/api/v1/replicas").json()}
            assert replicas["0"] == "FINISHED", replicas
        client = ControllerClient(ctl.grpc, "t", "2", "inc")
        try:
            with pytest.raises(JobCompleted, match="COMPLETED"):
                client.quorum(co.RequestQuorum(0, 0, ("127.0.0.1:1",), ("127.0.0.1:2",)), 1, "", 5.0)
        finally:
            client.close()
    finally:
        ctl.stop()

"""The pool layout on one machine: the dev overlay's agent DaemonSet pods, started exactly as the
rendered DaemonSet starts a pod (tests/deploy/test_daemonsets_on_loopback.py says how), serve
two jobs in turn without being restarted.

Each job is its own controller with its own job id on the same etcd, at the same address (the
controller pods' names the agents dial: here one loopback port that the first job's controller
leaves and the second one's takes, as the names move from the old job's pods to the new one's). The first job trains to COMPLETED; its controller goes
(`kubectl delete`); the agents, still the same processes, wait in the pool (--on-job-complete
=pool), register with the next job's controller and train it from step 0 to COMPLETED. Each
job's checkpoints go to its own folder of the shared checkpoint volume.

Small on purpose (two hosts of one rank, no spare, a few dozen steps): it is about the pool's
lifecycle; the dev job's faults are test_daemonsets_on_loopback.py's.
"""

from __future__ import annotations

import os
import sys

import pytest

from controller.launch import launch
from tests.ports import free_port

from .test_daemonsets_on_loopback import SECRETS, Job, children
from .test_manifests import render

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
OVERLAY = "kustomize/overlays/dev"
HOSTS = {"node-a": "127.0.0.2", "node-b": "127.0.0.3"}
MAX_STEPS, EVERY = "24", "10"


class Pool(Job):
    """The dev overlay's pool with one job's controller at a time on a fixed address."""

    def __init__(self, root, docs, etcd) -> None:
        super().__init__(root, docs)
        self.configmap.update(max_steps=MAX_STEPS, checkpoint_every_steps=EVERY)
        self.etcd, self.port = etcd, free_port()

    def start_job(self, job_id: str) -> None:
        with open(self.root / f"controller-{job_id}.err", "wb") as err:
            self.ctl = launch("--job-id", job_id, "--etcd", self.etcd.endpoint, "--replicas", "2",
                              "--min-replicas", "2", "--hosts-per-replica", "1", "--ranks-per-host", "1",
                              "--join-timeout-s", "2", "--heartbeat-timeout-s", "4", "--lease-ttl-s", "1",
                              "--event-log", "off", "--grpc-port", str(self.port), stderr=err,
                              env={**os.environ, "FTHSDP_JOB_SECRET": SECRETS["fthsdp-job-secret"]["secret"]})
        assert self.ctl.grpc == f"127.0.0.1:{self.port}"

    async def completes(self, job_id: str) -> dict:
        await self.until(f"job {job_id} COMPLETED", lambda: self.get("/api/v1/job")["job_state"] == "COMPLETED")
        done = self.get("/api/v1/job")
        assert done["job_id"] == job_id and done["replicas_finished"] == 2, done
        assert done["committed_step"] == int(MAX_STEPS) - 1 and done["digest_mismatches"] == 0, done
        return done

    def first_step(self) -> int:
        quorums = self.get("/api/v1/quorums")
        steps = [q["max_step"] for q in quorums["recent"]]
        return min(steps)


@pytest.mark.timeout(300)
async def test_the_pool_agents_serve_two_jobs_in_turn_without_restarting(tmp_path, etcd):
    suffix = os.urandom(3).hex()  # the session's etcd is shared
    first, second = f"pool-{suffix}-1", f"pool-{suffix}-2"
    pool = Pool(tmp_path, render(OVERLAY), etcd)
    try:
        pool.start_job(first)
        for node, ip in HOSTS.items():
            pool.start_agent("fthsdp-agent", node, ip)
        agents = {node: proc.pid for node, proc in pool.agents.items()}
        await pool.completes(first)
        assert pool.first_step() == 0
        await pool.until("the first job's trainers gone", lambda: not any(children(p) for p in agents.values()))
        checkpoints = tmp_path / "pvc-fthsdp-checkpoints"
        assert sorted(p.name for p in checkpoints.iterdir()) == [first]

        pool.ctl.stop()  # the first job's controller is deleted; the agents stay in the pool
        pool.ctl = None
        pool.start_job(second)
        await pool.completes(second)
        assert pool.first_step() == 0  # a new job from step 0, not the first one's end or checkpoint
        assert sorted(p.name for p in checkpoints.iterdir()) == [first, second]
        # the same agent processes served both jobs
        assert {node: proc.pid for node, proc in pool.agents.items()} == agents
        assert all(proc.poll() is None for proc in pool.agents.values())
        for node in HOSTS:
            log = (tmp_path / f"{node}.err").read_text()
            assert f"serving job {second}" in log and "back in the pool" in log, log[-2000:]
    except BaseException:
        print(pool.logs(), file=sys.stderr)
        raise
    finally:
        pool.stop()

"""The chaos run's trainer (fthsdp/demo/trainer.py) at the job's end: its ranks read the end
step from the steps file each at its own time, so one rank may end its loop a step before
the other (seed 35 of issue 28: the run wrote the end step while r0's rank 0 had read it and
its rank 1 had not). The rank that ends first closes, its replica finishes, and the other
rank's next batch is the end of the iteration: it must end cleanly too, not crash on the
StopIteration (which the coordinator saw as "rank 1 left the replica: closed the connection",
and the controller as r0 DEAD).

Real processes: a controller, and the two ranks of one replica (no agent: the test gives
them the environment an agent would), the second told to train one step more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from controller.launch import launch
from fthsdp.demo.data import prepare
from tests.ports import free_port
from tests.waiting import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(tmp_path, steps: int, ports: dict) -> str:
    cfg = {"job_id": "t", "model": "mlp", "data": str(tmp_path / "digits.npz"), "records": str(tmp_path / "records"),
           "replicas": ["r0"], "steps": steps, "max_steps": 1000, "seed": 1, "hidden": 8, "batch_rows": 16,
           "lr": 0.05, "ports": {"h0": ports}, "ports_by": "host", "min_step_s": 0.0, "digest_every_steps": 1,
           "timeouts": {"quorum_s": 30.0, "allreduce_s": 5.0, "vote_s": 10.0, "fetch_s": 10.0, "fetch_hold_s": 5.0,
                        "heartbeat_s": 0.5}}
    path = tmp_path / f"trainer-{steps}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_a_rank_whose_replica_ended_a_step_before_its_own_end_finishes_cleanly(tmp_path):
    (tmp_path / "records").mkdir()
    prepare(tmp_path / "digits.npz", 1)
    with open(tmp_path / "controller.log", "w") as log:
        controller = launch("--replicas", "1", "--min-replicas", "1", "--job-id", "t", "--join-timeout-s", "1",
                            stderr=log, timeout_s=30.0, cwd=REPO, insecure=True)
    ranks = []
    try:
        ports = {"leader": free_port(), "gloo": free_port()}
        for rank, steps in ((0, 4), (1, 5)):  # rank 1 would train one step more than its replica does
            env = {**os.environ, "FTHSDP_REPLICA_ID": "r0", "FTHSDP_RANK": str(rank), "FTHSDP_WORLD_SIZE": "2",
                   "FTHSDP_CONTROLLER": controller.grpc, "FTHSDP_HOST_ID": "h0", "FTHSDP_JOB_ID": "t",
                   "PYTHONPATH": REPO, "FTHSDP_INSECURE_TRAINER_PORTS": "1"}
            env.pop("FTHSDP_STANDBY", None)
            err = open(tmp_path / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
            command = [sys.executable, "-m", "fthsdp.demo.trainer", _config(tmp_path, steps, ports)]
            ranks.append((subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err), err))
        wait_until(lambda: all(p.poll() is not None for p, _ in ranks), 120.0, "both ranks to exit")
        logs = [(tmp_path / f"rank{k}.log").read_text() for k in range(2)]
        assert [p.returncode for p, _ in ranks] == [0, 0], logs
        events = httpx.get(f"{controller.http}/api/v1/events", params={"limit": 1000}, timeout=5.0).json()
        states = [e["message"] for e in events if e["kind"] == "replica" and e["subject"] == "r0"]
        assert any("became FINISHED" in m for m in states), states
        assert not any(e["kind"] == "death" for e in events), [e["message"] for e in events]
        done = [json.loads(line) for k in range(2) for line in
                (tmp_path / "records" / f"r0-{k}-{ranks[k][0].pid}.jsonl").read_text().splitlines()]
        assert sorted(r["rank"] for r in done if r["event"] == "done") == [0, 1]
    finally:
        for p, err in ranks:
            if p.poll() is None:
                p.kill()
                p.wait(10.0)
            err.close()
        controller.stop()

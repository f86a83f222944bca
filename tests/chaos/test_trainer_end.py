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


def _config(tmp_path, steps: int, ports: dict, name: str = "", host: str = "h0", **more) -> str:
    cfg = {"job_id": "t", "model": "mlp", "data": str(tmp_path / "digits.npz"), "records": str(tmp_path / "records"),
           "replicas": ["r0"], "steps": steps, "max_steps": 1000, "seed": 1, "hidden": 8, "batch_rows": 16,
           "lr": 0.05, "ports": {host: ports}, "ports_by": "host", "min_step_s": 0.0, "digest_every_steps": 1,
           "timeouts": {"quorum_s": 30.0, "allreduce_s": 5.0, "vote_s": 10.0, "fetch_s": 10.0, "fetch_hold_s": 5.0,
                        "heartbeat_s": 0.5}, **more}
    path = tmp_path / f"trainer-{name or steps}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _stop(procs: list, controller) -> None:
    """The trainers this test started (killed if still running, their logs closed), then the controller."""
    for p, err in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10.0)
        err.close()
    controller.stop()


def _env(controller, replica: str, rank: int, world: int, host: str) -> dict:
    env = {**os.environ, "FTHSDP_REPLICA_ID": replica, "FTHSDP_RANK": str(rank), "FTHSDP_WORLD_SIZE": str(world),
           "FTHSDP_CONTROLLER": controller.grpc, "FTHSDP_HOST_ID": host, "FTHSDP_JOB_ID": "t",
           "PYTHONPATH": REPO, "FTHSDP_INSECURE_TRAINER_PORTS": "1"}
    env.pop("FTHSDP_STANDBY", None)
    return env


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
            env = _env(controller, "r0", rank, 2, "h0")
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
        _stop(ranks, controller)


def test_a_replica_that_learns_the_end_after_the_others_finished_ends_too(tmp_path):
    """Seed 25 of the chaos run (bench.chaos --seeds 21-40): the run decided the end step from a
    view a controller failover had left stale, so one replica read it only after it had begun
    the step past the end. The others finished at the end, and it trained on alone: it ended
    only in a step every replica contributed to, which could never come again. Here r0 knows
    the end (4 steps) and r1 learns it once r0 finished: r1 ends too (its last full step was the
    end), with exit code 0, and the job COMPLETES."""
    (tmp_path / "records").mkdir()
    prepare(tmp_path / "digits.npz", 1)
    with open(tmp_path / "controller.log", "w") as log:
        # min 1, as the chaos run has it: a replica trains on alone once the others finished;
        # the 30 s join timeout keeps the first round open until both registered
        controller = launch("--replicas", "2", "--min-replicas", "1", "--job-id", "t", "--join-timeout-s", "30",
                            stderr=log, timeout_s=30.0, cwd=REPO, insecure=True)
    steps_file = tmp_path / "r1-steps"
    procs = []
    try:
        for replica, host in (("r0", "h0"), ("r1", "h1")):
            ports = {"leader": free_port(), "gloo": free_port()}
            more = {"replicas": ["r0", "r1"], "max_steps": 10**6}
            if replica == "r1":
                more["steps_file"] = str(steps_file)  # missing: no end yet
            config = _config(tmp_path, 4, ports, replica, host, **more)
            err = open(tmp_path / f"{replica}.log", "w")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([sys.executable, "-m", "fthsdp.demo.trainer", config],
                                           env=_env(controller, replica, 0, 1, host), cwd=REPO,
                                           stdout=subprocess.DEVNULL, stderr=err), err))

        def replica(rid: str) -> dict:
            return {r["replica_id"]: r for r in httpx.get(f"{controller.http}/api/v1/replicas", timeout=5.0).json()
                    }.get(rid, {})
        wait_until(lambda: replica("r0").get("state") == "FINISHED" and replica("r1").get("committed_step", 0) >= 6,
                   120.0, "r0 to finish and r1 to train on alone")
        steps_file.write_text("4")
        wait_until(lambda: all(p.poll() is not None for p, _ in procs), 120.0, "both replicas to exit")
        logs = [(tmp_path / f"{rid}.log").read_text()[-3000:] for rid in ("r0", "r1")]
        assert [p.returncode for p, _ in procs] == [0, 0], logs
        job = httpx.get(f"{controller.http}/api/v1/job", timeout=5.0).json()
        assert job["job_state"] == "COMPLETED", job
    finally:
        _stop(procs, controller)

"""examples/train_gpt.py as users launch it: one replica by torchrun, one by an agent, FSDP2 in each,
switched to DiLoCo by configuration alone.

Both replicas are 2 ranks sharding the transformer with FSDP2 over Gloo; they meet at the
same controller (--sync-mode diloco --sync-every 2; the trainers' FTHSDP_SYNC_* say the same)
every 2 training steps and all-reduce their pseudo-gradient shards over FTAR. At the end rank k
of one replica holds exactly what rank k of the other holds (the global state), and the job is
COMPLETED. Run from their own working directory with the example's defaults, they write a
durable checkpoint beside it. The example's synchronous runs: tests/runtime/test_endings_*.py,
test_cluster_endings.py, test_example_defaults.py and README's torchrun line (tests/docs).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests import trainer_secret
from tests.runtime.cluster import FTHSDP, PYTHON, REPO
from tests.runtime.test_torchrun import TORCHRUN, two_free_ports

pytestmark = pytest.mark.slow
STEPS = 5  # training steps: 3 syncs of H = 2
H = 2
SYNCS = 3


@pytest.mark.timeout(300)
def test_one_replica_under_torchrun_and_one_under_an_agent_train_the_example_alike(tmp_path, controller_process):
    ctl = controller_process("--replicas", "2", "--min-replicas", "1", "--join-timeout-s", "60", "--job-id", "gpt",
                             "--sync-mode", "diloco", "--sync-every", str(H))
    base = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    # the agent hands the job secret to its trainers; torchrun's trainers read it themselves
    base.update({"FTHSDP_CONTROLLER": ctl.grpc, "FTHSDP_JOB_ID": "gpt", "PYTHONPATH": str(REPO), **trainer_secret.ENV,
                 "FTHSDP_SYNC_MODE": "diloco", "FTHSDP_SYNC_EVERY_STEPS": str(H)})
    script = [str(REPO / "examples/train_gpt.py"), "--steps", str(STEPS), "--out", str(tmp_path)]
    with open(tmp_path / "torchrun.log", "w") as t_log, open(tmp_path / "agent.log", "w") as a_log:
        torchrun = subprocess.Popen(
            [TORCHRUN, "--nproc-per-node", "2", "--master-port", str(two_free_ports()), *script], cwd=tmp_path,
            env={**base, "FTHSDP_REPLICA_ID": "r0"}, stdout=t_log, stderr=subprocess.STDOUT)
        agent = subprocess.Popen(
            [FTHSDP, "agent", "--controller", ctl.grpc, "--host-id", "h1", "--job-id", "gpt", "--slots", "2",
             "--replica-id", "r1", "--ranks", "0,1", "--world-size", "2", "--heartbeat-interval-s", "0.5", "--",
             PYTHON, *script], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=a_log,
            env={**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(two_free_ports())})
        try:
            assert torchrun.wait(timeout=240) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
            assert agent.wait(timeout=60) == 0, (tmp_path / "agent.log").read_text()[-3000:]
        finally:
            for proc in (torchrun, agent):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    ends = {(r["replica"], r["rank"]): r for r in (json.loads(p.read_text()) for p in tmp_path.glob("r*-*.json"))}
    assert sorted(ends) == [("r0", 0), ("r0", 1), ("r1", 0), ("r1", 1)]
    assert {r["step"] for r in ends.values()} == {SYNCS}  # manager.step counts syncs
    assert {tuple(r["committed"]) for r in ends.values()} == {tuple(range(SYNCS))}
    for rank in (0, 1):  # the shards are equal rank by rank (and differ between the ranks)
        assert ends[("r0", rank)]["digest"] == ends[("r1", rank)]["digest"]
    assert ends[("r0", 0)]["digest"] != ends[("r0", 1)]["digest"]
    assert ends[("r0", 0)]["held_out_loss"] < 5.5  # it learnt: a uniform guess over 256 bytes scores ln 256 = 5.55
    job = httpx.get(f"{ctl.http}/api/v1/job", timeout=5.0).json()
    assert job["job_state"] == "COMPLETED"
    # safe by default: a checkpoint beside the run (a run shorter than the period: at its end),
    # and the controller knew the job had one
    assert (tmp_path / "fthsdp-checkpoints" / "gpt" / f"step-{SYNCS:010d}" / "COMPLETE").is_file()
    assert job["durable_checkpoint"] is True and job["checkpoint_warning"] == ""

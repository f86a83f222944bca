"""A real `torchrun --nproc-per-node 2` replica, given only torchrun's variables and the controller."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests import trainer_secret
from tests.ports import free_port
from tests.runtime.cluster import PYTHON, REPO

pytestmark = pytest.mark.slow
TORCHRUN = str(Path(PYTHON).with_name("torchrun"))


def two_free_ports() -> int:
    """A port P with P + 1 free too (torch.distributed's store takes P, the coordinator P + 1), from
    this worker's block below the ephemeral range (tests/ports.py): torchrun listens on them later."""
    for _ in range(50):
        port, after = free_port(), free_port()  # handed out in turn: P + 1 unless it was taken
        if after == port + 1:
            return port
    raise RuntimeError("no two consecutive free ports")


def test_a_torchrun_replica_needs_only_torchruns_variables_and_the_controller(tmp_path, controller_process):
    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--join-timeout-s", "0.2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"FTHSDP_CONTROLLER": ctl.grpc, "PYTHONPATH": str(REPO), **trainer_secret.ENV})
    port = two_free_ports()
    with open(tmp_path / "torchrun.log", "w") as log:
        done = subprocess.run([TORCHRUN, "--nproc-per-node", "2", "--master-port", str(port),
                               "tests/runtime/torchrun_worker.py", str(tmp_path), "4"],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=150)
    assert done.returncode == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["local_rank"]) for r in ranks] == [(0, 2, 0), (1, 2, 1)]
    assert {r["coordinator"] for r in ranks} == {f"127.0.0.1:{port + 1}"}  # MASTER_ADDR:MASTER_PORT+1
    assert [r["committed"] for r in ranks] == [[0, 1, 2, 3]] * 2 and {r["step"] for r in ranks} == {4}
    assert ranks[0]["digest"] == ranks[1]["digest"]
    # the replica reported itself FINISHED before its ranks exited: the job is COMPLETED
    assert httpx.get(f"{ctl.http}/api/v1/job", timeout=5.0).json()["job_state"] == "COMPLETED"


def readme_torchrun_line() -> tuple[dict[str, str], list[str]]:
    """README's torchrun command: (its environment assignments, the command)."""
    from tests.docs.test_commands import TORCHRUN_LINE, shell_commands

    [argv] = [a for a in shell_commands("README.md") if a[0].startswith(f"{TORCHRUN_LINE}=")]
    cut = next(i for i, a in enumerate(argv) if "=" not in a)
    return dict(a.split("=", 1) for a in argv[:cut]), argv[cut:]


@pytest.mark.timeout(900)  # two torchrun launches of two torch ranks each
def test_readmes_torchrun_line_trains_as_written_and_a_restart_after_the_end_exits_3(tmp_path, controller_process):
    """README's line as a user runs it (issue 39, finding 4): its controller address, master port
    and secret file pointed at this test's, and 3 steps on the CPU instead of 200. It trains to
    COMPLETED; run again after the end (what torchrun's late restart is), every rank exits 3."""
    secret = tmp_path / "job-secret"
    secret.write_text(trainer_secret.SECRET_HEX + "\n")
    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--join-timeout-s", "0.2",
                             "--job-secret-file", str(secret))
    assigned, command = readme_torchrun_line()
    assert set(assigned) == {"FTHSDP_CONTROLLER", "FTHSDP_REPLICA_ID", "FTHSDP_JOB_SECRET_FILE"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({**assigned, "FTHSDP_CONTROLLER": ctl.grpc, "FTHSDP_JOB_SECRET_FILE": str(secret),
                "PYTHONPATH": str(REPO),
                # the example's default checkpoints (fthsdp-checkpoints/ in the working directory,
                # the repository here) go to this test's folder instead
                "FTHSDP_CHECKPOINT_DIR": str(tmp_path / "checkpoints")})
    command = [TORCHRUN if a == "torchrun" else a for a in command]

    def run(name: str, *more: str) -> tuple[int, str]:
        argv = list(command)
        argv[argv.index("--master-port") + 1] = str(two_free_ports())
        with open(tmp_path / f"{name}.log", "w") as log:
            done = subprocess.run([*argv, "--steps", "3", "--cpu", *more], cwd=REPO, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=400)
        return done.returncode, (tmp_path / f"{name}.log").read_text()

    code, log = run("first")
    assert code == 0, log[-3000:]
    assert httpx.get(f"{ctl.http}/api/v1/job", timeout=5.0).json()["job_state"] == "COMPLETED"
    restart = command.index("--max-restarts") + 1
    command[restart] = "0"  # one attempt is enough to see its ranks' exit status
    code, log = run("after-the-end")
    assert code != 0 and "started after the job COMPLETED" in log, log[-3000:]
    assert "exitcode  : 3" in log and "exitcode  : 1 " not in log, log[-3000:]

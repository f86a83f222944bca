"""Every path a user takes ends clearly (issue 26), with examples/train_gpt.py as users run it.

Scenario 1: README's warm-spare line (`fthsdp agent ... --spare --standby -- python train.py`)
with a script that never calls wait_for_assignment: the standby waits for its assignment
inside the runtime (RuntimeSettings.from_env), the job's two replicas train and COMPLETE
alike, and no third replica ever appears.

A trainer the tests start themselves (not through an agent or torchrun) is examples/train_gpt.py
forked from the session's server that imported torch once (tests/forked.py): a real process
with its own environment, exit status and log, without a second torch import.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests import forked, trainer_secret
from tests.runtime.cluster import FTHSDP, PYTHON, REPO
from tests.runtime.test_torchrun import two_free_ports
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
STEPS = 5
BOUND_S = 240
#: examples/train_gpt.py's model at a size whose steps cost little: what these tests check (who
#: trains, how each path ends, equal digests) does not depend on the model's size
SMALL_MODEL = ("--layers", "1", "--d-model", "32", "--seq-len", "16")


def base_env(ctl) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"FTHSDP_JOB_ID": "gpt", "PYTHONPATH": str(REPO), **trainer_secret.ENV})
    return env


def agent(ctl, host: str, log: Path, script: list[str], *flags: str) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            [FTHSDP, "agent", "--controller", ctl.grpc, "--host-id", host, "--job-id", "gpt",
             "--heartbeat-interval-s", "0.5", *flags, "--", PYTHON, *script], cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=out,
            env={**base_env(ctl), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(two_free_ports())})


def example(log: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    """`python examples/train_gpt.py *args` to its end, forked from the test session's server that
    imported torch once (tests/forked.py): its exit status and its log."""
    return forked.run("examples.train_gpt", list(args), log=log, env=env, cwd=REPO, timeout_s=BOUND_S)


def wait_for_text(path: Path, text: str, bound_s: float, proc: subprocess.Popen) -> None:
    def seen() -> bool:
        assert proc.poll() is None, path.read_text()[-3000:]
        return text in path.read_text()
    wait_until(seen, bound_s, f"{text!r} in {path}")


@pytest.mark.timeout(400)
def test_a_warm_spare_with_a_script_that_does_not_wait_is_a_correct_standby(tmp_path, controller_process):
    ctl = controller_process("--replicas", "2", "--min-replicas", "1", "--join-timeout-s", "60", "--job-id", "gpt")
    script = ["examples/train_gpt.py", "--checkpoint-dir", "", "--steps", str(STEPS), "--out", str(tmp_path)]
    procs = []
    try:
        procs.append(agent(ctl, "spare", tmp_path / "spare.log", script, "--spare", "--standby"))
        wait_for_text(tmp_path / "spare.log", "standby: set up; waiting for the agent to hand over an assignment",
                      BOUND_S, procs[0])
        for i in range(2):
            procs.append(agent(ctl, f"h{i}", tmp_path / f"h{i}.log", script, "--replica-id", f"r{i}", "--ranks", "0",
                               "--world-size", "1"))
        for proc, name in zip(procs, ("spare", "h0", "h1")):  # COMPLETED: every agent ends, 0
            assert proc.wait(timeout=BOUND_S) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    ends = {r["replica"]: r for r in (json.loads(p.read_text()) for p in tmp_path.glob("r*-*.json"))}
    assert sorted(ends) == ["r0", "r1"] and {r["step"] for r in ends.values()} == {STEPS}
    assert ends["r0"]["digest"] == ends["r1"]["digest"]
    assert not list(tmp_path.glob("0-*.json"))  # the standby never trained as a replica of its own
    replicas = httpx.get(f"{ctl.http}/api/v1/replicas", timeout=5.0).json()
    assert sorted(r["replica_id"] for r in replicas) == ["r0", "r1"]
    assert httpx.get(f"{ctl.http}/api/v1/job", timeout=5.0).json()["job_state"] == "COMPLETED"


@pytest.mark.timeout(400)
def test_a_replica_started_after_completed_ends_with_its_exit_code_and_writes_nothing(tmp_path, controller_process):
    """Scenario 6: the job COMPLETED; a replica started afterwards learns it at its first quorum
    (before training), ends with JobAlreadyCompleted and exit status 3, and writes no results."""
    from examples.train_gpt import EXIT_JOB_ALREADY_COMPLETED

    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--join-timeout-s", "1", "--job-id", "gpt")
    env = {**base_env(ctl), "FTHSDP_CONTROLLER": ctl.grpc, "FTHSDP_REPLICA_ID": "r0"}
    args = ["--checkpoint-dir", "", "--steps", "2", "--cpu", *SMALL_MODEL]
    code, first = example(tmp_path / "first.log", env, *args, "--out", str(tmp_path))
    assert code == 0, first[-3000:]
    assert "finished after step 1" in first and (tmp_path / "r0-0.json").exists()
    assert httpx.get(f"{ctl.http}/api/v1/job", timeout=5.0).json()["job_state"] == "COMPLETED"
    late_out = tmp_path / "late"
    late_out.mkdir()
    code, late = example(tmp_path / "late.log", env, *args, "--out", str(late_out))
    assert code == EXIT_JOB_ALREADY_COMPLETED, late[-3000:]
    assert "replica r0 started after the job COMPLETED and trained nothing" in late
    assert "finished after" not in late and not list(late_out.iterdir())


@pytest.mark.timeout(400)
def test_a_trainer_whose_join_is_refused_because_the_job_failed_ends_with_that_error(tmp_path, controller_process):
    """Scenario 4, the trainer's side: once the job is FAILED a trainer's first join is refused
    naming the state (JobFailed on rank 0), and every rank ends non-zero with that Fatal error
    (not a retry loop)."""
    from agent.main import EXIT_JOB_FAILED
    from tests.agent.helpers import trainer_command

    ctl = controller_process("--replicas", "1", "--min-replicas", "1", "--restart-budget", "0", "--fail-after-s", "1",
                             "--job-id", "gpt")
    crashing = subprocess.run(
        [FTHSDP, "agent", "--controller", ctl.grpc, "--host-id", "h0", "--replica-id", "r0", "--ranks", "0",
         "--world-size", "1", "--heartbeat-interval-s", "0.3", "--", *trainer_command(tmp_path, "--exit", "1")],
        cwd=REPO, env=base_env(ctl), capture_output=True, text=True, timeout=BOUND_S)
    assert crashing.returncode == EXIT_JOB_FAILED, crashing.stderr[-3000:]
    assert httpx.get(f"{ctl.http}/api/v1/job", timeout=5.0).json()["job_state"] == "FAILED"
    env = {**base_env(ctl), "FTHSDP_CONTROLLER": ctl.grpc, "FTHSDP_REPLICA_ID": "x"}
    code, late = example(tmp_path / "late.log", env, "--checkpoint-dir", "", "--steps", "2", "--cpu",
                         "--out", str(tmp_path))
    assert code != 0
    assert "fthsdp.errors.Fatal: the controller says the job is FAILED, so this replica ends" in late, late
    assert 'job "gpt" is FAILED: ' in late and "no replica can make progress" in late
    assert not list(tmp_path.glob("x-*.json"))


def worker_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    """The pid of torchrun's worker of `rank` (None until it runs)."""
    try:
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    except OSError:
        return None
    for pid in map(int, children):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RESTART_COUNT=0" in env:
            return pid
    return None


@pytest.mark.timeout(500)
def test_torchrun_max_restarts_brings_a_killed_ranks_replica_back_to_equal_digests(tmp_path, controller_process):
    """Scenario 3: two replicas of 2 ranks under `torchrun --max-restarts 3`; rank 1 of r0 is
    SIGKILLed: torchrun restarts r0's ranks, their rendezvous succeeds on the first try (no
    "connectFullMesh failed"), r0 rejoins as a new incarnation, catches up from r1, and both
    end at the same step with equal digests, rank by rank. `--min-replicas 2`: r1 trains no step
    alone, so it can neither run ahead before r0 first joins nor finish the job while torchrun
    restarts r0 -- the job would then be COMPLETED and the restarted r0 refused, as it should be.
    The kill comes once r0 committed step 3; the job's 60 steps of a small model leave it many
    steps to land before the end (they take about 2 s on a quiet machine)."""
    import signal

    from tests.runtime.test_torchrun import TORCHRUN

    steps = 60
    ctl = controller_process("--replicas", "2", "--min-replicas", "2", "--join-timeout-s", "2", "--job-id", "gpt")
    env = {**base_env(ctl), "FTHSDP_CONTROLLER": ctl.grpc}
    script = ["examples/train_gpt.py", "--checkpoint-dir", "", "--steps", str(steps), "--out", str(tmp_path), "--cpu",
              *SMALL_MODEL]
    launchers, logs = {}, {}
    try:
        for rid in ("r0", "r1"):
            logs[rid] = tmp_path / f"{rid}.log"
            with open(logs[rid], "w") as log:
                launchers[rid] = subprocess.Popen(
                    [TORCHRUN, "--nproc-per-node", "2", "--master-port", str(two_free_ports()), "--max-restarts", "3",
                     *script], cwd=REPO, env={**env, "FTHSDP_REPLICA_ID": rid}, stdout=log, stderr=subprocess.STDOUT)

        def r0_trains():
            r0 = {r["replica_id"]: r for r in httpx.get(f"{ctl.http}/api/v1/replicas", timeout=5.0).json()}.get("r0")
            return r0 is not None and r0["committed_step"] >= 3
        wait_until(r0_trains, BOUND_S, "r0 committing steps")
        victim = worker_pid(launchers["r0"], 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        for rid, launcher in launchers.items():
            assert launcher.wait(timeout=BOUND_S) == 0, logs[rid].read_text()[-3000:]
    finally:
        for launcher in launchers.values():
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    r0_log = logs["r0"].read_text()
    assert "connectFullMesh failed" not in r0_log and "failed to connect" not in r0_log, r0_log[-3000:]
    events = httpx.get(f"{ctl.http}/api/v1/events?limit=1000", timeout=5.0).json()
    assert any(e["subject"] == "r0" and "became DEAD" in e["message"] for e in events)
    assert any(e["subject"] == "r0" and "BEHIND" in e["message"] for e in events)  # it caught up
    ends = {(r["replica"], r["rank"]): r for r in (json.loads(p.read_text()) for p in tmp_path.glob("r*-*.json"))}
    assert sorted(ends) == [("r0", 0), ("r0", 1), ("r1", 0), ("r1", 1)]
    assert {r["step"] for r in ends.values()} == {steps}
    for rank in (0, 1):
        assert ends[("r0", rank)]["digest"] == ends[("r1", rank)]["digest"]

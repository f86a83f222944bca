"""Issue 26 on real processes (a controller, agents and examples/train_gpt.py trainers on
loopback), scenarios 2 and 6:

2. A trainer that joins as a replica outside the configured set (a standby that took the
   default id "0") is refused with a message naming the configured replicas; the job's two
   replicas train on, COMPLETE with equal digests, and no third replica or member appears.
6. A host's agent and its trainer SIGKILLed at the default heartbeat timeout (10 s): its
   leader's connection closed, so its replica is suspect at once and the survivor forms a
   quorum of its own before the host is declared dead by heartbeat (the order of the events,
   read from the REST views; no durations are asserted).

Every wait is a condition with a bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.runtime.cluster import FTHSDP, PYTHON, REPO
from tests.runtime.test_cluster_endings import base_env, example
from tests.runtime.test_torchrun import two_free_ports
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
BOUND_S = 240


def gated_agent(ctl, host: str, replica: str, log: Path, gate: Path | None, script: list[str]) -> subprocess.Popen:
    """An agent holding `replica` whose trainer waits to read a line from the FIFO `gate` (when
    given) before it runs `script`."""
    command = [PYTHON, *script]
    if gate is not None:
        os.mkfifo(gate)
        command = ["bash", "-c", 'read -r _ < "$0" && exec "$@"', str(gate), *command]
    with open(log, "w") as out:
        return subprocess.Popen(
            [FTHSDP, "agent", "--controller", ctl.grpc, "--host-id", host, "--job-id", "gpt", "--replica-id", replica,
             "--ranks", "0", "--world-size", "1", "--heartbeat-interval-s", "0.5", "--", *command], cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=out,
            env={**base_env(ctl), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(two_free_ports())})


def open_gate(gate: Path) -> None:
    """Let the trainer waiting on `gate` run (once it reads the FIFO: bounded)."""
    def writer():
        try:
            return os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            return None
    fd = wait_until(writer, BOUND_S, f"a trainer reading {gate}")
    os.write(fd, b"go\n")
    os.close(fd)


def get(ctl, path: str):
    return httpx.get(f"{ctl.http}{path}", timeout=10.0).json()


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(500)
def test_a_trainer_outside_the_configured_replicas_is_refused_and_the_job_is_unaffected(tmp_path, controller_process):
    ctl = controller_process("--replicas", "2", "--min-replicas", "1", "--job-id", "gpt")
    steps = 5
    script = ["examples/train_gpt.py", "--checkpoint-dir", "", "--steps", str(steps), "--out", str(tmp_path), "--cpu"]
    agents = []
    try:
        for i in range(2):  # the job's replicas: their hosts hold r0 and r1; the trainers wait at their gates
            agents.append(gated_agent(ctl, f"h{i}", f"r{i}", tmp_path / f"h{i}.log", tmp_path / f"gate{i}", script))
        wait_until(lambda: {h["host_id"] for h in get(ctl, "/api/v1/hosts")} == {"h0", "h1"}, BOUND_S,
                   "both agents registered")
        intruder_out = tmp_path / "intruder"
        intruder_out.mkdir()
        code, intruder = example(  # as a standby that did not wait for its assignment: the default id "0"
            tmp_path / "intruder.log", {**base_env(ctl), "FTHSDP_CONTROLLER": ctl.grpc, "FTHSDP_REPLICA_ID": "0"},
            *script[1:-3], "--out", str(intruder_out), "--cpu")
        assert code != 0, intruder[-3000:]
        assert ("Quorum was refused: FAILED_PRECONDITION: replica '0' is not one of this job's configured replicas "
                "(r0, r1): no host holds it") in intruder, intruder[-3000:]
        assert not list(intruder_out.iterdir())
        assert "0" not in {r["replica_id"] for r in get(ctl, "/api/v1/replicas")}  # state unchanged
        for i in range(2):
            open_gate(tmp_path / f"gate{i}")
        for i, proc in enumerate(agents):  # COMPLETED: every agent ends, 0
            assert proc.wait(timeout=BOUND_S) == 0, (tmp_path / f"h{i}.log").read_text()[-3000:]
    finally:
        stop(agents)
    for i in range(2):  # a normal start says nothing about the controller not knowing the replica yet
        assert "does not know this replica yet" not in (tmp_path / f"h{i}.log").read_text()
    ends = {r["replica"]: r for r in (json.loads(p.read_text()) for p in tmp_path.glob("r*-*.json"))}
    assert sorted(ends) == ["r0", "r1"] and {r["step"] for r in ends.values()} == {steps}
    assert ends["r0"]["digest"] == ends["r1"]["digest"]
    assert sorted(r["replica_id"] for r in get(ctl, "/api/v1/replicas")) == ["r0", "r1"]
    job = get(ctl, "/api/v1/job")
    assert job["job_state"] == "COMPLETED", job
    quorums = [e["message"] for e in get(ctl, "/api/v1/events?limit=1000") if e["kind"] == "quorum"]
    assert quorums and not any(m.split(" at step ")[0].split(": ")[1].split(", ").count("0") for m in quorums)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the agent's trainers and theirs), from /proc."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return children + [d for c in children for d in descendants(c)]


def committed(ctl, *replicas: str) -> dict[str, int]:
    views = {r["replica_id"]: r for r in get(ctl, "/api/v1/replicas")}
    return {r: views[r]["committed_step"] for r in replicas if r in views and views[r]["state"] == "HEALTHY"}


@pytest.mark.timeout(500)
@pytest.mark.parametrize("port", ("quorum-port", "stream"))
def test_a_killed_host_is_suspect_at_once_and_the_survivor_goes_on_before_its_heartbeat_times_out(
        tmp_path, controller_process, port):
    """`stream`: the leaders stay on QuorumStream (--no-quorum-port); a leader that dies between
    two joins there was never suspect before (only one that died while it waited)."""
    # the controller's production defaults: heartbeat timeout 10 s, join timeout 5 s
    ctl = controller_process("--replicas", "2", "--min-replicas", "1", "--job-id", "gpt",
                             *(("--no-quorum-port",) if port == "stream" else ()))
    script = ["examples/train_gpt.py", "--checkpoint-dir", "", "--steps", "100000", "--out", str(tmp_path), "--cpu"]
    agents = [gated_agent(ctl, f"h{i}", f"r{i}", tmp_path / f"h{i}.log", None, script) for i in range(2)]
    try:
        def both_past_step_3():
            steps = committed(ctl, "r0", "r1")
            return len(steps) == 2 and min(steps.values()) >= 3
        wait_until(both_past_step_3, BOUND_S, "r0 and r1 committing together")
        trainers = descendants(agents[1].pid)
        assert trainers, "h1's trainer"
        os.kill(agents[1].pid, signal.SIGKILL)  # the agent first: no heartbeat of h1 comes after its trainer's end
        for pid in trainers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # gone with its agent already
        agents[1].wait(timeout=BOUND_S)

        def seq(events, kind, subject=None, members=None, after=0):
            for e in events:
                if e["seq"] > after and e["kind"] == kind and (subject is None or e["subject"] == subject) and (
                        members is None or e["message"].split(" at step ")[0].split(": ", 1)[1] == members):
                    return e["seq"]
            return None

        def dead_by_heartbeat():
            events = get(ctl, "/api/v1/events?limit=1000")
            return seq(events, "host_death", "h1") is not None and events
        events = wait_until(dead_by_heartbeat, BOUND_S, "h1 declared dead by heartbeat")
        assert any(r["state"] == "HEALTHY" for r in get(ctl, "/api/v1/replicas") if r["replica_id"] == "r0")
    finally:
        stop(agents)
    (tmp_path / "events.json").write_text(json.dumps(events, indent=1))
    # r0's quorum alone after the kill: the first after the last quorum r1 was in (a slow start can
    # give r0 a quorum alone before r1 first joined)
    together = max(e["seq"] for e in events if e["kind"] == "quorum"
                   and "r1" in e["message"].split(" at step ")[0].split(": ", 1)[1].split(", "))
    suspect, death = seq(events, "suspect", "r1"), seq(events, "host_death", "h1")
    alone = seq(events, "quorum", members="r0", after=together)
    assert suspect is not None, [e["message"] for e in events][-30:]
    assert alone is not None, [e["message"] for e in events][-30:]
    assert suspect < alone < death, [(e["seq"], e["kind"], e["message"]) for e in events][-30:]
    [suspected] = [e for e in events if e["seq"] == suspect]
    assert "replica r1 is suspect: " in suspected["message"] and "closed without goodbye" in suspected["message"]
    [quorum] = [e for e in events if e["seq"] == alone]
    assert "r1 suspect: its coordinator's connection closed" in quorum["message"], quorum
    [died] = [e for e in events if e["seq"] == death]
    assert "h1" in died["message"] and "silent" in died["message"], died

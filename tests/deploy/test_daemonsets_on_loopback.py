"""The dev overlay's job on one machine, without a cluster: every "host" is an agent started
exactly as the rendered DaemonSets start a pod, training the example trainer.

The agents' command, flags and environment are read from `kubectl kustomize` output. Only what
a cluster provides is substituted, as kubelet would: the downward-API values (spec.nodeName,
status.podIP: each host gets its own loopback address 127.0.0.2, 127.0.0.3, ...; the zone
label), the ConfigMap keys (`max_steps` made short for a test), the controller pods' names
fthsdp-controller-N.fthsdp-controller (here: the address of a controller this test starts, shaped like the
dev ConfigMap: 2 replicas x 2 hosts x 1 rank), the image's paths (/opt/fthsdp/train.py is
deploy/examples/train.py; `python` is this interpreter; `fthsdp` is this virtualenv's) and the
pod's volumes (each mount a folder of the test's: emptyDirs empty, Secrets holding their keys).

The job trains, survives a killed rank on the second host of a replica (the replica restarts
as a unit on both its hosts) and a killed host (its agent and trainer SIGKILLed: the warm
spare's standby trainer takes the rank, meeting only the restarted rank 0: race 2 of issue 28,
tests/runtime/test_race_rendezvous.py), and finishes COMPLETED, with no digest mismatch
between the replicas. min_replicas is 2, so no step is trained without both replicas and the
job's length does not race the faults.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from controller.launch import launch, read_json_line
from tests.waiting import wait_for_blocking

from . import pods
from .test_manifests import ROOT, _by, render

pytestmark = pytest.mark.slow
BOUND_S = 120
OVERLAY = "kustomize/overlays/dev"
MAX_STEPS = "120"
HOSTS = {"node-a": "127.0.0.2", "node-b": "127.0.0.3", "node-c": "127.0.0.4", "node-d": "127.0.0.5"}
SPARE = ("node-s", "127.0.0.6")
TRAIN_PY = str(ROOT / "deploy" / "examples" / "train.py")
# The Secrets an operator creates (deploy/README.md, "Secrets"), by name and key.
SECRETS = {"fthsdp-job-secret": {"secret": secrets.token_hex(32)}}


def pod_command(daemonset: dict, configmap: dict, node: str, pod_ip: str, controller: str,
                pod_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The agent container's command line and environment on `node`, as kubelet would start it."""
    spec = daemonset["spec"]["template"]["spec"]
    c = next(c for c in spec["containers"] if c["name"] == "agent")
    downward = {"spec.nodeName": node, "status.podIP": pod_ip,
                "metadata.labels['topology.kubernetes.io/zone']": "", "metadata.labels['fthsdp.io/block']": ""}
    env = pods.environment(c, downward, {"fthsdp-controller": configmap})
    # the controller pods' names (fthsdp-controller-N.fthsdp-controller): all the one controller here
    here = {f"fthsdp-controller-{n}.fthsdp-controller:50051": controller for n in range(3)}
    here["/opt/fthsdp/train.py"] = TRAIN_PY
    here.update(pods.volumes(spec, c, pod_dir, SECRETS))
    assert c["command"] == ["fthsdp", "agent"]
    return pods.command_line(c, env, here)


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def environ(pid: int) -> dict[str, str]:
    """The environment a process was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


class Job:
    def __init__(self, root: Path, docs: list[dict]) -> None:
        self.root, self.docs = root, docs
        self.configmap = dict(_by(docs, "ConfigMap", "fthsdp-controller")["data"], max_steps=MAX_STEPS)
        self.agents: dict[str, subprocess.Popen] = {}
        self.ctl = None

    def start_controller(self) -> None:
        with open(self.root / "controller.err", "wb") as err:
            self.ctl = launch("--job-id", "dev", "--replicas", self.configmap["replicas"], "--min-replicas", "2",
                              "--hosts-per-replica", "2", "--ranks-per-host", "1", "--join-timeout-s", "2",
                              "--heartbeat-timeout-s", "4", "--event-log", "off", stderr=err,
                              # the job's Secret, as the Deployment mounts it (agents prove it)
                              env={**os.environ, "FTHSDP_JOB_SECRET": SECRETS["fthsdp-job-secret"]["secret"]})

    def start_agent(self, daemonset: str, node: str, pod_ip: str) -> None:
        argv, env = pod_command(_by(self.docs, "DaemonSet", daemonset), self.configmap, node, pod_ip,
                                self.ctl.grpc, self.root / f"pod-{node}")
        with open(self.root / f"{node}.err", "wb") as err:
            proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, text=True)
        self.agents[node] = proc
        line = read_json_line(proc, 60, f"agent {node}")
        assert line["event"] == "registered" and line["host_id"] == node, line

    def get(self, path: str):
        return httpx.get(f"{self.ctl.http}{path}", timeout=10).json()

    def replicas(self) -> dict[str, dict]:
        return {r["replica_id"]: r for r in self.get("/api/v1/replicas")}

    def holder(self, replica: str, rank: int) -> str:
        return next(h["host_id"] for h in self.get("/api/v1/hosts")
                    if h["assignment"] and h["assignment"]["replica_id"] == replica and rank in h["assignment"]["ranks"])

    def trainer(self, node: str) -> int | None:
        pids = children(self.agents[node].pid)
        return pids[0] if len(pids) == 1 else None

    async def until(self, what: str, check):
        return await wait_for_blocking(check, BOUND_S, what, every_s=0.1)

    async def trains(self, *replicas: str, beyond: int = 0) -> dict[str, dict]:
        def check():
            view = self.replicas()
            return all(view.get(r, {}).get("state") == "HEALTHY" and view[r]["committed_step"] > beyond
                       for r in replicas) and view
        return await self.until(f"{replicas} committing past step {beyond}", check)

    def stop(self) -> None:
        trainers = [pid for proc in self.agents.values() for pid in children(proc.pid)]
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.agents.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for pid in trainers:  # they die with their agent (PR_SET_PDEATHSIG); any left go now
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        if self.ctl is not None:
            self.ctl.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.root.glob("*.err")))


# Three rounds of trainer starts (torch imports: the first, r0's restart, r1's), each ~25 s on
# a loaded 2-core machine, a few seconds when idle: more than the suite's default 120 s.
@pytest.mark.timeout(300)
async def test_the_dev_daemonsets_train_survive_a_dead_rank_and_a_lost_host_and_complete(tmp_path):
    job = Job(tmp_path, render(OVERLAY))
    try:
        job.start_controller()
        for node, ip in HOSTS.items():  # one at a time: the controller lays them out in this order
            job.start_agent("fthsdp-agent", node, ip)
        job.start_agent("fthsdp-agent-spare", *SPARE)
        await job.trains("r0", "r1", beyond=2)
        # Each host's first assignment got its own version as it registered; a rank meets under its
        # rank 0's (fthsdp.process_group), so its coordinator admits it: no replica restarted to start
        assert {r: v["restarts"] for r, v in job.replicas().items()} == {"r0": 0, "r1": 0}
        assert [job.holder("r0", 0), job.holder("r0", 1), job.holder("r1", 0), job.holder("r1", 1)] == list(HOSTS)
        # Each rank was told its layout by the agent; ranks meet at their rank-0 host's pod IP.
        for node, ip in HOSTS.items():
            env = environ(job.trainer(node))
            rank0 = HOSTS["node-a" if node in ("node-a", "node-b") else "node-c"]
            assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (
                "0" if node in ("node-a", "node-c") else "1", "2", "0")
            assert env["MASTER_ADDR"] == rank0 and env["FTHSDP_COORDINATOR_ADDRESS"].startswith(rank0 + ":")
            assert env["POD_IP"] == ip and env["FTHSDP_MAX_STEPS"] == MAX_STEPS
            # the Secret's value, read by the agent from the mounted file; the file's path stays behind
            assert env["FTHSDP_JOB_SECRET"] == SECRETS["fthsdp-job-secret"]["secret"]
            assert "FTHSDP_JOB_SECRET_FILE" not in env
        standby = job.trainer(SPARE[0])
        assert environ(standby)["FTHSDP_STANDBY"] == "1" and "RANK" not in environ(standby)
        assert environ(standby)["FTHSDP_JOB_SECRET"] == SECRETS["fthsdp-job-secret"]["secret"]

        # 1. A rank on the second host of r0 dies: both hosts restart r0's ranks together.
        old = {node: job.trainer(node) for node in ("node-a", "node-b")}
        at = job.replicas()["r0"]["committed_step"]
        os.kill(old["node-b"], signal.SIGKILL)
        await job.until("r0 restarted as a unit", lambda: job.replicas()["r0"]["restarts"] == 1)
        await job.trains("r0", "r1", beyond=at + 1)
        new = {node: job.trainer(node) for node in ("node-a", "node-b")}
        assert all(new[n] and new[n] != old[n] for n in new), (old, new)  # the survivor restarted too
        assert not {h["host_id"]: h for h in job.get("/api/v1/hosts")}["node-b"]["cordoned"]

        # 2. r1's second host is lost (agent and trainer SIGKILLed): the warm spare takes its rank.
        at = job.replicas()["r1"]["committed_step"]
        job.agents["node-d"].kill()
        await job.until("node-s holds r1 rank 1", lambda: job.holder("r1", 1) == SPARE[0])
        await job.trains("r0", "r1", beyond=at + 1)
        assert job.trainer(SPARE[0]) == standby  # warm: the standby process itself took the rank
        assert "standby takes replica r1 rank 1" in (tmp_path / f"{SPARE[0]}.err").read_text()

        # 3. The job runs to its end.
        await job.until("the job COMPLETED", lambda: job.get("/api/v1/job")["job_state"] == "COMPLETED")
        done = job.get("/api/v1/job")
        assert done["replicas_finished"] == 2 and done["digest_mismatches"] == 0 and done["swaps"] == 1
        assert {r["state"] for r in job.replicas().values()} == {"FINISHED"}
        assert done["committed_step"] == int(MAX_STEPS) - 1
    except BaseException:
        print(job.logs(), file=sys.stderr)
        raise
    finally:
        job.stop()

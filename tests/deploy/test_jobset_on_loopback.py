"""The per-job layout on one machine: the jobset-dev overlay's JobSet, each of its pods started as
local processes with exactly the command, arguments and environment the pod would get
(tests/deploy/pods.py says what is substituted: the downward API's JobSet name and completion
index, the pod IPs 127.0.0.20..., the Secrets as files, the namespace ConfigMap, the pod DNS
name <jobset>-controller-0-0.<jobset> resolved to the controller pod's IP).

The job trains; one host pod's processes are SIGKILLed mid-run (its ranks go to the warm
spare) and, as the Job controller would, a new pod takes its completion index; the job runs to
COMPLETED and every agent exits 0. A second job in the same namespace (the JobSet under a fresh
name) then trains from step 0. The exit codes are then read through the JobSet's own
podFailurePolicy, successPolicy and failurePolicy (test_jobset.py reads them as the Job and
JobSet controllers do): the JobSet Completed. The ConfigMap's timeouts and the job's length are
made short for a test, as in test_daemonsets_on_loopback.py.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from controller.launch import read_json_line
from tests.waiting import wait_for_blocking

from . import pods
from .test_daemonsets_on_loopback import TRAIN_PY, children
from .test_jobset import jobset_outcome, pod_outcome, replicated
from .test_manifests import _by, render

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
BOUND_S = 120
MAX_STEPS = "40"
IPS = {("controller", 0): "127.0.0.20", ("hosts", 0): "127.0.0.21", ("hosts", 1): "127.0.0.22",
       ("spares", 0): "127.0.0.23"}
SECRETS = {"fthsdp-job-secret": {"secret": secrets.token_hex(32)}, "fthsdp-admin-token": {"token": secrets.token_hex(16)}}


class JobSetPods:
    def __init__(self, root: Path, etcd, name: str = "") -> None:
        """The overlay's JobSet, or a copy of it named `name` (the next job's overlay)."""
        self.root = root
        [self.js] = [d for d in render("kustomize/overlays/jobset-dev") if d["kind"] == "JobSet"]
        self.js = {**self.js, "metadata": {**self.js["metadata"], "name": name or self.js["metadata"]["name"]}}
        self.name = self.js["metadata"]["name"]
        cm = dict(_by(render("kustomize/overlays/jobset-namespace"), "ConfigMap", "fthsdp-controller")["data"])
        settings = dict(json.loads(cm["controller.json"]), join_timeout_s=2, heartbeat_timeout_s=4)
        cm.update({"etcd_endpoints": etcd.endpoint, "controller.json": json.dumps(settings)})
        self.configmaps = {"fthsdp-controller": cm}
        self.procs: dict[tuple[str, int], list[subprocess.Popen]] = {}
        self.http = ""

    def start(self, rjob: str, index: int) -> subprocess.Popen:
        """One pod of replicated job `rjob` at completion index `index` (a second call: its new pod)."""
        spec = replicated(self.js, rjob)["template"]["spec"]["template"]["spec"]
        [c] = spec["containers"]
        ip = IPS[(rjob, index)]
        downward = {"metadata.labels['jobset.sigs.k8s.io/jobset-name']": self.name,
                    "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
                    "metadata.labels['topology.kubernetes.io/zone']": "", "metadata.labels['fthsdp.io/block']": "",
                    "status.podIP": ip}
        env = pods.environment(c, downward, self.configmaps)
        if "FTHSDP_MAX_STEPS" in env:
            env.update(FTHSDP_MAX_STEPS=MAX_STEPS, FTHSDP_CHECKPOINT_EVERY_STEPS="10")
        attempt = len(self.procs.get((rjob, index), []))
        here = {f"{self.name}-controller-0-0.{self.name}": IPS[("controller", 0)], "0.0.0.0": ip,
                "/opt/fthsdp/train.py": TRAIN_PY}
        pod = f"{self.name}-{rjob}-{index}-{attempt}"
        here.update(pods.volumes(spec, c, self.root / pod, SECRETS, self.configmaps))
        argv, env = pods.command_line(c, env, here)
        with open(self.root / f"{pod}.err", "wb") as err:
            proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, text=True)
        self.procs.setdefault((rjob, index), []).append(proc)
        line = read_json_line(proc, 60, f"pod {rjob}-{index}")
        if rjob == "controller":
            assert line["event"] == "serving" and line["job_id"] == self.name, line
            self.http = line["http"]
        else:
            assert line["event"] == "registered" and line["host_id"] == f"{self.name}-{rjob[:-1]}-{index}", line
        return proc

    def get(self, path: str):
        token = SECRETS["fthsdp-admin-token"]["token"]
        return httpx.get(f"{self.http}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()

    async def until(self, what: str, check):
        return await wait_for_blocking(check, BOUND_S, what, every_s=0.2)

    def stop(self) -> None:
        everything = [p for ps in self.procs.values() for p in ps]
        trainers = [pid for p in everything for pid in children(p.pid)]
        for p in everything:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in everything:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for pid in trainers:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.root.glob("*.err")))


@pytest.mark.timeout(300)
async def test_the_jobset_pods_train_survive_a_lost_host_pod_and_complete(tmp_path, etcd):
    job = JobSetPods(tmp_path, etcd)
    try:
        job.start("controller", 0)
        for key in (("hosts", 0), ("hosts", 1), ("spares", 0)):
            job.start(*key)
        await job.until("both replicas commit", lambda: all(
            r["state"] == "HEALTHY" and r["committed_step"] > 2 for r in job.get("/api/v1/replicas")) and len(
            job.get("/api/v1/replicas")) == 2)
        assert job.get("/api/v1/job")["job_id"] == job.name

        # host 1's pod is lost (agent and trainer SIGKILLed): the spare takes its rank ...
        [lost] = job.procs[("hosts", 1)]
        trainer = children(lost.pid)
        lost.kill()
        for pid in trainer:
            os.kill(pid, signal.SIGKILL)
        spare = f"{job.name}-spare-0"
        await job.until("the spare holds a replica", lambda: any(
            h["host_id"] == spare and h["assignment"] for h in job.get("/api/v1/hosts")))
        # ... and the Job controller starts a new pod at index 1 (same host id, as available)
        job.start("hosts", 1)
        await job.until("the job COMPLETED", lambda: job.get("/api/v1/job")["job_state"] == "COMPLETED")
        done = job.get("/api/v1/job")
        assert done["committed_step"] == int(MAX_STEPS) - 1 and done["digest_mismatches"] == 0, done

        agents = {key: ps for key, ps in job.procs.items() if key[0] != "controller"}
        for ps in agents.values():
            for p in ps:
                p.wait(BOUND_S)
        codes = {key: [p.returncode for p in ps] for key, ps in agents.items()}
        assert codes == {("hosts", 0): [0], ("hosts", 1): [-signal.SIGKILL, 0], ("spares", 0): [0]}, codes
        # What the JobSet makes of them: each pod's end through its Job's podFailurePolicy ...
        states = {"controller": "Active"}
        for rjob in ("hosts", "spares"):
            spec = replicated(job.js, rjob)["template"]["spec"]
            ends = {index: [pod_outcome(spec, c) for c in cs] for (r, index), cs in codes.items() if r == rjob}
            assert all(e[-1] == "succeeded" for e in ends.values()) and len(ends) == spec["completions"], ends
            assert sum(e.count("Count") for e in ends.values()) <= spec["backoffLimit"]
            states[rjob] = "Complete"
        # ... and the JobSet's success policy
        assert jobset_outcome(job.js, states) == "Completed"
        assert [p.name for p in (tmp_path / "pvc-fthsdp-checkpoints").iterdir()] == [job.name]
    except BaseException:
        print(job.logs(), file=sys.stderr)
        raise
    finally:
        job.stop()

    # The next job in the same namespace: the same JobSet under a fresh name (its job id), the same
    # etcd and checkpoint volume. It trains from step 0, not from the first one's end.
    second = JobSetPods(tmp_path, etcd, name="dev-2")
    try:
        for key in (("controller", 0), ("hosts", 0), ("hosts", 1)):
            second.start(*key)
        await second.until("the second job COMPLETED", lambda: second.get("/api/v1/job")["job_state"] == "COMPLETED")
        assert second.get("/api/v1/job")["job_id"] == "dev-2"
        assert min(q["max_step"] for q in second.get("/api/v1/quorums")["recent"]) == 0
        assert sorted(p.name for p in (tmp_path / "pvc-fthsdp-checkpoints").iterdir()) == [job.name, "dev-2"]
    except BaseException:
        print(second.logs(), file=sys.stderr)
        raise
    finally:
        second.stop()

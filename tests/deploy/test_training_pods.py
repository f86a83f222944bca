"""Every pod that runs trainers, in both layouts (the pool's agent DaemonSets, the JobSet's host and
spare pods): checkpoints on a volume that outlives it, a termination grace that covers the
agent's stop grace, a writable HOME, the training PriorityClass, probes on pool agents."""

from __future__ import annotations

import pytest

from .test_manifests import JOBSET_OVERLAYS, OVERLAYS, _by, jobset_jobs, render

#: Seconds the termination grace keeps beyond the agent's stop grace: the agent's own
#: deregistration (bounded by its RPC timeout, 5 s) and process exits.
MARGIN_S = 10


def training_pods() -> list[tuple[str, dict, dict]]:
    """(where, pod template, the namespace's documents) for every agent pod template."""
    out = []
    for rel in OVERLAYS:
        docs = render(rel)
        for ds in (d for d in docs if d["kind"] == "DaemonSet"):
            out.append((f"{rel} {ds['metadata']['name']}", ds["spec"]["template"], docs))
    namespace = render("kustomize/overlays/jobset-namespace")
    for rel in JOBSET_OVERLAYS:
        for js in (d for d in render(rel) if d["kind"] == "JobSet"):
            for job in jobset_jobs(js):
                template = job["spec"]["template"]
                if template["metadata"]["labels"]["app.kubernetes.io/component"] == "agent":
                    out.append((f"{rel} {job['metadata']['name']}", template, namespace))
    return out


PODS = training_pods()


def _agent(template: dict) -> dict:
    return next(c for c in template["spec"]["containers"] if c["name"] == "agent")


def _volume_at(template: dict, path: str) -> dict:
    c = _agent(template)
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == path)
    assert not mount.get("readOnly")
    return next(v for v in template["spec"]["volumes"] if v["name"] == mount["name"])


@pytest.mark.parametrize("where, template, docs", PODS, ids=[p[0] for p in PODS])
def test_checkpoints_go_to_a_claim_that_outlives_the_pod(where, template, docs):
    env = {e["name"]: e for e in _agent(template)["env"]}
    claim = _volume_at(template, env["FTHSDP_CHECKPOINT_DIR"]["value"])["persistentVolumeClaim"]["claimName"]
    pvc = _by(docs, "PersistentVolumeClaim", claim)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # every host of every replica writes there
    every = env["FTHSDP_CHECKPOINT_EVERY_STEPS"]
    value = every.get("value") or _by(docs, "ConfigMap", every["valueFrom"]["configMapKeyRef"]["name"])["data"][
        every["valueFrom"]["configMapKeyRef"]["key"]]
    assert int(value) > 0


@pytest.mark.parametrize("where, template, docs", PODS, ids=[p[0] for p in PODS])
def test_the_termination_grace_covers_the_agents_stop_grace(where, template, docs):
    args = _agent(template)["args"]
    stop_grace = float(next(a for a in args if a.startswith("--stop-grace-s=")).split("=")[1])
    assert template["spec"]["terminationGracePeriodSeconds"] >= stop_grace + MARGIN_S


@pytest.mark.parametrize("where, template, docs", PODS, ids=[p[0] for p in PODS])
def test_home_is_writable_and_the_pod_has_the_training_priority(where, template, docs):
    env = {e["name"]: e for e in _agent(template)["env"]}
    assert "emptyDir" in _volume_at(template, env["HOME"]["value"])
    assert template["spec"]["priorityClassName"] == "fthsdp-training"
    assert _by(docs, "PriorityClass", "fthsdp-training")["value"] > 0


POOL = [p for p in PODS if p[0].split()[0] in OVERLAYS]


@pytest.mark.parametrize("where, template, docs", POOL, ids=[p[0] for p in POOL])
def test_pool_agents_have_probes(where, template, docs):
    """Exec probes on PID 1, the agent (it listens on no port); an agent waiting in the pool
    between jobs is Ready, so a roll does not stall there."""
    c = _agent(template)
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["exec"]["command"][:2] == ["python", "-c"], probe

"""The per-job layout: one JobSet (jobset.x-k8s.io/v1alpha2) per job, and the namespace it runs in.

`kubectl kustomize` renders custom resources without validating them, so: the JobSet's fields
are checked against a small JSON schema written from the JobSet API (v1alpha2 JobSetSpec:
replicatedJobs, network, successPolicy, failurePolicy with rules, suspend,
ttlSecondsAfterFinished), each replicated job's template as a batch/v1 Job and each pod
template as a v1 Pod with kubernetes-validate; and the policies are read the way the JobSet and
Job controllers read them, against the agents' real exit codes (agent/main.py).
"""

from __future__ import annotations

import re

import jsonschema
import kubernetes_validate
import pytest

from agent.main import EXIT_CONNECT_TIMEOUT, EXIT_JOB_FAILED

from .test_manifests import JOBSET_OVERLAYS, K8S_VERSION, _by, jobset_jobs, render

_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
_NAMES = {"type": "array", "items": {"type": "string"}}
#: The JobSet v1alpha2 fields these manifests may use, with their types and enums (from the
#: API's Go types: JobSetSpec, ReplicatedJob, Network, SuccessPolicy, FailurePolicy,
#: FailurePolicyRule). Unknown fields are refused, as the API server's structural schema would.
JOBSET_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
        "kind": {"const": "JobSet"},
        "metadata": {"type": "object", "required": ["name"], "properties": {"name": _NAME}},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["replicatedJobs"],
            "properties": {
                "replicatedJobs": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "required": ["name", "template"],
                    "properties": {"name": _NAME, "groupName": {"type": "string"},
                                   "replicas": {"type": "integer", "minimum": 0},
                                   "template": {"type": "object", "required": ["spec"]},
                                   "dependsOn": {"type": "array", "maxItems": 5}}}},
                "network": {"type": "object", "additionalProperties": False, "properties": {
                    "enableDNSHostnames": {"type": "boolean"}, "subdomain": {"type": "string"},
                    "publishNotReadyAddresses": {"type": "boolean"}}},
                "successPolicy": {"type": "object", "additionalProperties": False, "required": ["operator"],
                                  "properties": {"operator": {"enum": ["All", "Any"]},
                                                 "targetReplicatedJobs": _NAMES}},
                "failurePolicy": {"type": "object", "additionalProperties": False, "properties": {
                    "maxRestarts": {"type": "integer", "minimum": 0},
                    "restartStrategy": {"enum": ["Recreate", "BlockingRecreate"]},
                    "rules": {"type": "array", "items": {
                        "type": "object", "additionalProperties": False, "required": ["name", "action"],
                        "properties": {
                            "name": {"type": "string", "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                            "action": {"enum": ["FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"]},
                            "onJobFailureReasons": _NAMES, "onJobFailureMessagePatterns": _NAMES,
                            "targetReplicatedJobs": _NAMES}}}}},
                "startupPolicy": {"type": "object", "required": ["startupPolicyOrder"], "properties": {
                    "startupPolicyOrder": {"enum": ["AnyOrder", "InOrder"]}}},
                "suspend": {"type": "boolean"},
                "coordinator": {"type": "object", "required": ["replicatedJob"]},
                "managedBy": {"type": "string", "maxLength": 63},
                "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
            },
        },
    },
}
LOCALQUEUE_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {"apiVersion": {"const": "kueue.x-k8s.io/v1beta1"}, "kind": {"const": "LocalQueue"},
                   "spec": {"type": "object", "required": ["clusterQueue"], "additionalProperties": False,
                            "properties": {"clusterQueue": _NAME}}}}
#: Job failure reasons (batch/v1) the JobSet's failure policy may match on.
JOB_FAILURE_REASONS = {"PodFailurePolicy", "BackoffLimitExceeded", "DeadlineExceeded", "MaxFailedIndexesExceeded",
                       "FailedIndexes"}


def jobset(rel: str) -> dict:
    [js] = [d for d in render(rel) if d["kind"] == "JobSet"]
    return js


def replicated(js: dict, name: str) -> dict:
    return next(rj for rj in js["spec"]["replicatedJobs"] if rj["name"] == name)


def pod(js: dict, name: str) -> dict:
    return replicated(js, name)["template"]["spec"]["template"]


def flag(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{name}="))


# ------------------------------------------------------------------ the Job and JobSet controllers' reading


def pod_outcome(job_spec: dict, exit_code: int, container: str = "agent", disrupted: bool = False) -> str:
    """What the Job controller does with one pod's end: "succeeded", "FailJob", "Ignore" or
    "Count" (counted against backoffLimit), by the podFailurePolicy's first matching rule."""
    if exit_code == 0 and not disrupted:
        return "succeeded"
    for rule in job_spec.get("podFailurePolicy", {}).get("rules", []):
        codes = rule.get("onExitCodes")
        if codes and codes.get("containerName", container) == container and not disrupted:
            if (exit_code in codes["values"]) == (codes["operator"] == "In"):
                return rule["action"]
        if disrupted and any(c["type"] == "DisruptionTarget" for c in rule.get("onPodConditions", [])):
            return rule["action"]
    return "Count"


def jobset_outcome(js: dict, job_states: dict[str, str]) -> str:
    """The JobSet's end given each replicated job's Job state ("Complete", "Failed:<reason>" or
    "Active"): "Completed", "Failed", "Restart" or "Running"."""
    for name, state in job_states.items():
        if state.startswith("Failed:"):
            reason = state.split(":", 1)[1]
            for rule in js["spec"].get("failurePolicy", {}).get("rules", []):
                if rule.get("targetReplicatedJobs") and name not in rule["targetReplicatedJobs"]:
                    continue
                if not rule.get("onJobFailureReasons") or reason in rule["onJobFailureReasons"]:
                    return "Failed" if rule["action"] == "FailJobSet" else "Restart"
            return "Restart" if js["spec"].get("failurePolicy", {}).get("maxRestarts", 0) > 0 else "Failed"
    policy = js["spec"].get("successPolicy", {"operator": "All"})
    targets = policy.get("targetReplicatedJobs") or list(job_states)
    done = [job_states[t] == "Complete" for t in targets]
    return "Completed" if (all(done) if policy["operator"] == "All" else any(done)) else "Running"


# ------------------------------------------------------------------ schemas


@pytest.mark.parametrize("rel", JOBSET_OVERLAYS)
def test_the_jobset_fits_the_api_and_its_jobs_and_pods_validate(rel):
    js = jobset(rel)
    jsonschema.validate(js, JOBSET_SCHEMA)
    for job in jobset_jobs(js):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)
        template = job["spec"]["template"]
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template["metadata"]},
                                      "spec": template["spec"]}, K8S_VERSION, strict=True)
    for rule in js["spec"]["failurePolicy"]["rules"]:
        assert set(rule["onJobFailureReasons"]) <= JOB_FAILURE_REASONS


def test_a_field_the_api_does_not_have_is_refused():
    js = jobset("kustomize/overlays/jobset-dev")
    with pytest.raises(jsonschema.ValidationError, match="backoffLimitPerIndex"):
        jsonschema.validate({**js, "spec": {**js["spec"], "backoffLimitPerIndex": 1}}, JOBSET_SCHEMA)
    with pytest.raises(jsonschema.ValidationError, match="'Sometimes' is not one of"):
        jsonschema.validate({**js, "spec": {**js["spec"], "successPolicy": {"operator": "Sometimes"}}}, JOBSET_SCHEMA)


def test_the_namespace_has_the_queue_the_jobsets_name():
    docs = render("kustomize/overlays/jobset-namespace")
    queue = _by(docs, "LocalQueue", "fthsdp")
    jsonschema.validate(queue, LOCALQUEUE_SCHEMA)
    for rel in JOBSET_OVERLAYS:
        assert jobset(rel)["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue["metadata"]["name"]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("ConfigMap", "fthsdp-controller"), ("PersistentVolumeClaim", "fthsdp-checkpoints"),
            ("ServiceAccount", "fthsdp-agent"), ("StatefulSet", "fthsdp-etcd")} <= names


# ------------------------------------------------------------------ what the JobSet does


@pytest.mark.parametrize("rel", JOBSET_OVERLAYS)
def test_the_job_id_is_the_jobsets_name_and_agents_reach_its_controller_pod(rel):
    js = jobset(rel)
    name = js["metadata"]["name"]
    assert js["spec"]["network"]["enableDNSHostnames"] is True and "subdomain" not in js["spec"]["network"]
    c = pod(js, "controller")["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["JOB_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['jobset.sigs.k8s.io/jobset-name']"
    assert flag(c["args"], "--job-id") == "$(JOB_ID)"
    # <jobset>-<replicated job>-<job index>-<pod index>.<subdomain: the JobSet's name>
    assert flag(c["args"], "--advertise-address") == "$(JOB_ID)-controller-0-0.$(JOB_ID):50051"
    assert replicated(js, "controller")["replicas"] == 1
    assert replicated(js, "controller")["template"]["spec"]["completions"] == 1
    for rj in ("hosts", "spares"):
        a = pod(js, rj)["spec"]["containers"][0]
        assert flag(a["args"], "--controller") == flag(c["args"], "--advertise-address")
        env = {e["name"]: e for e in a["env"]}
        assert env["HOST_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.annotations['batch.kubernetes.io/job-completion-index']")
        assert flag(a["args"], "--host-id") == f"$(JOB_ID)-{rj[:-1]}-$(HOST_INDEX)"
        assert replicated(js, rj)["template"]["spec"]["completionMode"] == "Indexed"
        assert "--job-id" not in " ".join(a["args"])  # the controller's
    assert re.fullmatch(r"[a-z0-9-]+", name)


@pytest.mark.parametrize("rel", JOBSET_OVERLAYS)
def test_one_host_pod_per_layout_slot(rel):
    js = jobset(rel)
    args = pod(js, "controller")["spec"]["containers"][0]["args"]
    hosts = replicated(js, "hosts")["template"]["spec"]
    assert hosts["parallelism"] == hosts["completions"] == (
        int(flag(args, "--replicas")) * int(flag(args, "--hosts-per-replica")))
    for rj in ("hosts", "spares"):
        assert flag(pod(js, rj)["spec"]["containers"][0]["args"], "--slots") == flag(args, "--ranks-per-host")


@pytest.mark.parametrize("rel", JOBSET_OVERLAYS)
def test_the_policies_follow_the_agents_exit_codes(rel):
    js = jobset(rel)
    hosts = replicated(js, "hosts")["template"]["spec"]
    controller = replicated(js, "controller")["template"]["spec"]
    for spec in (hosts, replicated(js, "spares")["template"]["spec"], controller):
        assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it
    # COMPLETED: every agent exits 0, the hosts Job completes, and so does the JobSet
    assert pod_outcome(hosts, 0) == "succeeded"
    assert jobset_outcome(js, {"controller": "Active", "hosts": "Complete", "spares": "Active"}) == "Completed"
    assert jobset_outcome(js, {"controller": "Active", "hosts": "Active", "spares": "Complete"}) == "Running"
    # FAILED: exit 4 fails the Job by its podFailurePolicy, and the JobSet without a restart
    assert pod_outcome(hosts, EXIT_JOB_FAILED) == "FailJob"
    assert jobset_outcome(js, {"controller": "Active", "hosts": "Failed:PodFailurePolicy"}) == "Failed"
    # a refused controller (e.g. the job id is finished in the store) fails it too
    assert pod_outcome(controller, 2, container="controller") == "FailJob"
    # a crash or a lost controller: a new pod takes the index; out of retries, a whole restart
    assert pod_outcome(hosts, 137) == pod_outcome(hosts, EXIT_CONNECT_TIMEOUT) == "Count"
    assert jobset_outcome(js, {"hosts": "Failed:BackoffLimitExceeded"}) == "Restart"
    # evicted, preempted, drained: not the pod's fault
    assert pod_outcome(hosts, 143, disrupted=True) == "Ignore"
    assert js["spec"]["ttlSecondsAfterFinished"] > 0 and "suspend" in js["spec"]


def test_the_gpu_jobset_waits_for_kueue_and_holds_gpus():
    js = jobset("kustomize/overlays/jobset")
    assert js["spec"]["suspend"] is True and js["metadata"]["name"] == "llm-1"
    for rj in ("hosts", "spares"):
        res = pod(js, rj)["spec"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == flag(pod(js, rj)["spec"]["containers"][0]["args"], "--slots")

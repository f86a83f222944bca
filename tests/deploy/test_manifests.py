"""Kubernetes manifests: schema-valid for a current release, and the checks that matter.

Overlays are rendered with `kubectl kustomize` (kustomize v5 built into kubectl; Debian package
`kubectl`). Without kubectl the rendering tests skip and say so; the per-file tests still run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.37.0"  # newest schemas kubernetes-validate ships; bump with it
# Directories under deploy/ that hold a kustomization.yaml.
KUSTOMIZATIONS = ["kustomize/common", "kustomize/base", "kustomize/etcd", "kustomize/etcd-tls",
                  "kustomize/overlays/dev", "kustomize/overlays/production", "kustomize/jobset",
                  "kustomize/overlays/jobset-namespace", "kustomize/overlays/jobset", "kustomize/overlays/jobset-dev",
                  "kustomize/overlays/rdma"]
#: The pool layout's overlays: a namespace with the agent DaemonSets and a job's controller.
OVERLAYS = ["kustomize/overlays/dev", "kustomize/overlays/production"]
#: The per-job layout: one JobSet each (tests/deploy/test_jobset.py checks them further).
JOBSET_OVERLAYS = ["kustomize/overlays/jobset", "kustomize/overlays/jobset-dev"]
#: Kinds of custom resources: no schema in kubernetes-validate; test_jobset.py checks them.
CUSTOM_KINDS = {"JobSet", "LocalQueue"}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}
KUBECTL = shutil.which("kubectl")


def _load_all(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _kustomization(rel: str) -> dict:
    return yaml.safe_load((DEPLOY / rel / "kustomization.yaml").read_text())


def _listed_files(key: str) -> set[Path]:
    out = set()
    for rel in KUSTOMIZATIONS:
        for entry in _kustomization(rel).get(key, []):
            if isinstance(entry, dict) and "path" not in entry:
                continue  # an inline patch
            path = (DEPLOY / rel / (entry["path"] if isinstance(entry, dict) else entry)).resolve()
            if path.is_file():
                out.add(path)
    return out


MANIFEST_FILES = sorted(_listed_files("resources"))
PATCH_FILES = sorted(_listed_files("patches"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


_rendered: dict[str, list[dict]] = {}


def render(rel: str) -> list[dict]:
    if KUBECTL is None:
        raise AssertionError("kubectl is not installed: `make test` installs it (apt-get install kubectl)")
    if not _rendered:  # all at once, in parallel: each kubectl start costs most of a second
        procs = {k: subprocess.Popen([KUBECTL, "kustomize", str(DEPLOY / k)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for k in KUSTOMIZATIONS}
        for k, proc in procs.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"kubectl kustomize deploy/{k}: {err}"
            _rendered[k] = _load_all(out)
    return _rendered[rel]


def _validate(doc: dict) -> None:
    if doc["kind"] in CUSTOM_KINDS:
        return
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = "/".join(str(p) for p in err.absolute_path)
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {where}: {err.message}")


def _pod_spec(obj: dict) -> dict | None:
    if obj["kind"] not in WORKLOAD_KINDS:
        return None
    return obj["spec"]["template"]["spec"]


def _containers(obj: dict):
    spec = _pod_spec(obj)
    if spec:
        for c in spec.get("initContainers", []) + spec["containers"]:
            yield spec, c


def jobset_jobs(jobset: dict) -> list[dict]:
    """A JobSet's replicated jobs as the Jobs it creates (one per replicated job: the shape)."""
    name = jobset["metadata"]["name"]
    return [{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-{rj['name']}"},
             "spec": rj["template"]["spec"]} for rj in jobset["spec"]["replicatedJobs"]]


def _everything() -> list[tuple[str, list[dict]]]:
    """Every rendered job: the pool overlays (controller, agents and their trainers) and the
    JobSet overlays, each JobSet as the Jobs it creates."""
    out = [(rel, render(rel)) for rel in OVERLAYS]
    for rel in JOBSET_OVERLAYS:
        docs = render(rel)
        out.append((rel, [j for d in docs if d["kind"] == "JobSet" for j in jobset_jobs(d)]))
    return out


def _by(docs: list[dict], kind: str, name: str) -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


# ---------------------------------------------------------------- schemas


# Prometheus Operator resources have no schema here: tests/controller/test_dashboard.py checks them.
CUSTOM_RESOURCE_FILES = {DEPLOY / "monitoring" / "podmonitor.yaml", DEPLOY / "monitoring-production" / "https.yaml"}


def test_every_yaml_file_is_a_manifest_a_patch_or_a_kustomization():
    stray = {p for p in DEPLOY.rglob("*.yaml")} - set(MANIFEST_FILES) - set(PATCH_FILES) - CUSTOM_RESOURCE_FILES
    stray = {p for p in stray if p.name != "kustomization.yaml"}
    assert not stray, f"not validated anywhere: {sorted(map(_rel, stray))}"


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=_rel)
def test_manifest_file_is_valid(path):
    docs = _load_all(path.read_text())
    assert docs, f"{_rel(path)} holds no object"
    for doc in docs:
        _validate(doc)


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_rendered_kustomization_is_valid(rel):
    docs = render(rel)
    assert docs
    for doc in docs:
        _validate(doc)


@pytest.mark.parametrize("rel", OVERLAYS)
def test_overlay_puts_everything_in_its_namespace(rel):
    namespace = _kustomization(rel)["namespace"]
    docs = render(rel)
    assert any(d["kind"] == "Namespace" and d["metadata"]["name"] == namespace for d in docs)
    for d in docs:
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"].get("namespace") == namespace, d["metadata"]["name"]


# ---------------------------------------------------------------- pod security


def test_every_container_has_resources_and_a_locked_down_security_context():
    for where, docs in _everything():
        for obj in docs:
            for pod, c in _containers(obj):
                name = f"{where}: {obj['kind']}/{obj['metadata']['name']}/{c['name']}"
                res = c.get("resources", {})
                for part in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(res.get(part, {})), f"{name}: {part}"
                for key, value in res.get("requests", {}).items():
                    if "/" in key:  # extended resources (GPUs) must have requests == limits
                        assert res["limits"].get(key) == value, f"{name}: {key}"
                sc, psc = c.get("securityContext", {}), pod.get("securityContext", {})
                assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, name
                assert psc.get("runAsUser", sc.get("runAsUser", 0)) != 0, name
                assert sc.get("readOnlyRootFilesystem") is True, name
                assert sc.get("allowPrivilegeEscalation") is False, name
                assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
                assert "add" not in sc.get("capabilities", {}), name
                assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
                assert not pod.get("hostNetwork") and not pod.get("hostPID"), name


def test_no_secret_values_are_committed():
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.suffix in {".yaml", ".yml", ".json"}:
            for doc in _load_all(path.read_text()):
                if isinstance(doc, dict) and doc.get("kind") == "Secret":  # (a JSON patch is a list)
                    assert not doc.get("data") and not doc.get("stringData"), _rel(path)
    for where, docs in _everything():
        for obj in docs:
            for _, c in _containers(obj):
                for arg in c.get("args", []) + c.get("command", []):
                    assert not re.match(r"--admin-token(=|$)", arg), f"{where}: token on the command line"
                for env in c.get("env", []):
                    assert env["name"] != "FTHSDP_ADMIN_TOKEN" or "value" not in env, where


def test_every_referenced_secret_is_documented_for_operators():
    readme = (DEPLOY / "README.md").read_text()
    for where, docs in _everything():
        for obj in docs:
            spec = _pod_spec(obj) or {}
            for vol in spec.get("volumes", []):
                if "secret" in vol:
                    assert vol["secret"]["secretName"] in readme, f"{where}: {vol['secret']['secretName']}"


def test_every_agent_and_trainer_pod_gets_the_job_secret_from_its_secret_file():
    for where, docs in _everything():
        pods = [o for o in docs if o["kind"] in ("DaemonSet", "Job")
                and o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"]
        assert pods, where
        for obj in pods:
            spec, c = next(_containers(obj))
            env = {e["name"]: e for e in c.get("env", [])}
            assert "FTHSDP_JOB_SECRET" not in env and "FTHSDP_INSECURE_TRAINER_PORTS" not in env, where
            path = Path(env["FTHSDP_JOB_SECRET_FILE"]["value"])
            mount = next(m for m in c["volumeMounts"] if path.parent == Path(m["mountPath"]))
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            assert mount.get("readOnly") and volume["secret"]["secretName"] == "fthsdp-job-secret", where
            assert not volume["secret"].get("optional") and path.name == "secret", where


# ---------------------------------------------------------------- the controller


@pytest.mark.parametrize("rel", OVERLAYS)
def test_controllers_have_stable_names_that_clients_dial_and_a_pdb_that_lets_one_go(rel):
    """A StatefulSet of 3 behind a headless Service: each pod advertises its stable name, every
    client is given all three (a standby's refusal names the leader's, which must be one of
    them: protos/dial.py), liveness is no gRPC health (it would kill standbys), and the PDB lets
    a drain take one controller at a time, the leader included."""
    docs = render(rel)
    sts = _by(docs, "StatefulSet", "fthsdp-controller")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = _by(docs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    c = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "controller")
    advertised = next(a for a in c["args"] if a.startswith("--advertise-address=")).split("=", 1)[1]
    assert advertised == f"$(POD_NAME).{headless['metadata']['name']}:50051"
    names = [advertised.replace("$(POD_NAME)", f"{sts['metadata']['name']}-{n}") for n in range(3)]
    for ds in (d for d in docs if d["kind"] == "DaemonSet"):
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--controller={','.join(names)}" in args, ds["metadata"]["name"]
    assert "grpc" not in c["livenessProbe"] and "exec" not in c["livenessProbe"]
    pdb = _by(docs, "PodDisruptionBudget", "fthsdp-controller")
    assert pdb["spec"] == {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                           "selector": {"matchLabels": sts["spec"]["selector"]["matchLabels"]}}


@pytest.mark.parametrize("rel", OVERLAYS)
def test_controller_command_line_uses_the_cli_flags_and_its_env_resolves(rel):
    docs = render(rel)
    deploy = _by(docs, "StatefulSet", "fthsdp-controller")
    c = deploy["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["fthsdp", "controller"]
    flags = {a.split("=", 1)[0] for a in c["args"]}
    assert {"--grpc-port", "--http-port", "--replicas", "--min-replicas", "--etcd", "--settings",
            "--admin-token-file", "--job-id"} <= flags
    env = {e["name"]: e for e in c.get("env", [])}
    for arg in c["args"]:
        for var in re.findall(r"\$\((\w+)\)", arg):
            assert var in env, f"{arg} uses an undefined variable"
    for e in env.values():
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            assert ref["key"] in _by(docs, "ConfigMap", ref["name"])["data"], ref
    cm = _by(docs, "ConfigMap", "fthsdp-controller")["data"]
    assert 1 <= int(cm["min_replicas"]) <= int(cm["replicas"])
    yaml.safe_load(cm["controller.json"])  # JSON is YAML: at least it parses


# ---------------------------------------------------------------- wiring


@pytest.mark.parametrize("rel", OVERLAYS)
def test_service_selectors_and_ports_match_pods(rel):
    docs = render(rel)
    pods = [(o, _pod_spec(o)) for o in docs if _pod_spec(o)]
    for svc in (d for d in docs if d["kind"] == "Service"):
        sel = svc["spec"]["selector"].items()
        matched = [(o, spec) for o, spec in pods if sel <= o["spec"]["template"]["metadata"]["labels"].items()]
        assert matched, f"Service {svc['metadata']['name']} selects no pods"
        for port in svc["spec"]["ports"]:
            for o, spec in matched:
                named = {p.get("name") for c in spec["containers"] for p in c.get("ports", [])}
                assert port["targetPort"] in named, f"{svc['metadata']['name']} -> {o['metadata']['name']}"
    for o, _ in pods:
        if "selector" in o["spec"] and o["kind"] != "Job":
            assert o["spec"]["selector"]["matchLabels"].items() <= o["spec"]["template"]["metadata"]["labels"].items()


def _selects(selector: dict, labels: dict) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


@pytest.mark.parametrize("rel", OVERLAYS)
def test_network_policy_lets_agents_and_trainers_reach_grpc_and_nobody_else(rel):
    docs = render(rel)
    policy = _by(docs, "NetworkPolicy", "fthsdp-controller")
    grpc_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 50051)
    assert [p["port"] for p in grpc_rule["ports"]] == [50051, 50052]  # gRPC and the quorum port
    http_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 8080)
    peers = [p["podSelector"] for p in grpc_rule["from"]]
    assert all(set(p) == {"podSelector"} for p in grpc_rule["from"]), "gRPC open to other namespaces"
    clients = [o for o in docs if o["kind"] == "DaemonSet"]  # the trainers run in the agent pods
    assert len(clients) == 2
    for o in clients:
        assert any(_selects(p, o["spec"]["template"]["metadata"]["labels"]) for p in peers), o["metadata"]["name"]
    controller = _by(docs, "StatefulSet", "fthsdp-controller")
    assert not any(_selects(p, controller["spec"]["template"]["metadata"]["labels"]) for p in peers)
    assert {"fthsdp.io/operator": "true"} in [p.get("podSelector", {}).get("matchLabels") for p in http_rule["from"]]
    etcd_policy = _by(docs, "NetworkPolicy", "fthsdp-etcd")
    etcd_client = etcd_policy["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert _selects(etcd_client, controller["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize("rel", OVERLAYS)
def test_agents_split_active_and_spare_hosts_of_the_node_pool_and_serve_job_after_job(rel):
    """The pool layout: both DaemonSets select the pool's node label (not every GPU node), the
    agents outlive jobs (--on-job-complete=pool) and a template change rolls host by host."""
    docs = render(rel)
    active, spare = _by(docs, "DaemonSet", "fthsdp-agent"), _by(docs, "DaemonSet", "fthsdp-agent-spare")
    a_args = active["spec"]["template"]["spec"]["containers"][0]["args"]
    s_args = spare["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--spare" in s_args and "--spare" not in a_args
    assert spare["spec"]["template"]["spec"]["nodeSelector"]["fthsdp.io/spare"] == "true"
    terms = active["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "fthsdp.io/spare", "operator": "NotIn", "values": ["true"]} in terms[0]["matchExpressions"]
    assert "--standby" in s_args and "--standby" not in a_args  # warm spares: trainers set up, waiting
    for ds in (active, spare):
        assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
        pod = ds["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["fthsdp.io/node-pool"] == "fthsdp"
        assert "nvidia.com/gpu.present" not in pod["nodeSelector"]
        args = pod["containers"][0]["args"]
        assert "--host-id=$(NODE_NAME)" in args and any(a.startswith("--controller=fthsdp-controller-0.") for a in args)
        assert "--replica-id" not in " ".join(args) and "--job-id" not in " ".join(args)  # the controller's
        assert "--on-job-complete=pool" in args  # a DaemonSet would restart an agent that exits
        assert pod["priorityClassName"] == _by(docs, "PriorityClass", "fthsdp-training")["metadata"]["name"]
    if rel == "overlays/production":
        assert "nvidia.com/gpu" in active["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize("rel", OVERLAYS)
def test_agents_advertise_their_pod_ip_and_nothing_points_at_loopback(rel):
    """Replicas span hosts: their ranks meet at the pod IP of their rank-0 host, which each agent
    registers (--advertise-address=$(POD_IP)); nothing hands a trainer a loopback address."""
    docs = render(rel)
    layout = yaml.safe_load(_by(docs, "ConfigMap", "fthsdp-controller")["data"]["controller.json"])
    for ds in (_by(docs, "DaemonSet", n) for n in ("fthsdp-agent", "fthsdp-agent-spare")):
        pod = ds["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert "--advertise-address=$(POD_IP)" in c["args"]
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        for e in c["env"]:
            assert "127.0.0.1" not in str(e.get("value", "")) and e["name"] not in (
                "MASTER_ADDR", "MASTER_PORT", "FTHSDP_COORDINATOR_ADDRESS"), e
        assert not any("127.0.0.1" in a for a in c["args"])
        slots = int(next(a for a in c["args"] if a.startswith("--slots=")).split("=")[1])
        assert slots == layout["ranks_per_host"], "a host runs one layout slot: its ranks per host"
        # The agent's kept secret (--state-dir) lives on a volume that outlives a container restart.
        state = next(a for a in c["args"] if a.startswith("--state-dir=")).split("=")[1]
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == state)
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert layout["hosts_per_replica"] > 1  # replicas span hosts in every overlay


def test_image_references_are_consistent_across_overlays_and_match_the_version():
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    for where, docs in _everything():
        images: dict[str, set[str]] = {}
        for obj in docs:
            for _, c in _containers(obj):
                images.setdefault(c["name"], set()).add(c["image"])
        assert {"controller", "agent"} <= set(images), where
        for name, refs in images.items():
            assert len(refs) == 1, f"{where}: {name} uses several images: {sorted(refs)}"
        (agent,) = images["agent"]
        assert "/trainer" in agent  # the agent starts trainers from its own image: the trainer image
        for name in ("controller", "agent"):
            (ref,) = images[name]
            if where == "kustomize/overlays/production":  # a tag can move; a digest cannot
                assert re.fullmatch(r"registry\.example\.com/fthsdp/\w+@sha256:[0-9a-f]{64}", ref), ref
            else:
                assert ref.endswith(f":{version}"), f"{where}: {name} image {ref} is not tagged {version}"
        assert not any(ref.endswith(":latest") for refs in images.values() for ref in refs), where


def test_dockerfiles_run_as_non_root_and_copy_files_that_exist():
    for name in ("controller", "trainer"):
        text = (DEPLOY / "images" / f"{name}.Dockerfile").read_text()
        users = re.findall(r"^USER\s+(\S+)", text, re.M)
        assert users and users[-1].split(":")[0] not in {"0", "root"}, name
        for src in re.findall(r"^COPY (?:--chmod=\S+ )?(?!--from)(\S+) ", text, re.M):
            if src not in {".", "${TRAIN_SCRIPT}"}:
                assert (ROOT / src).exists(), f"{name}.Dockerfile copies missing {src}"
        assert (DEPLOY / "images" / f"{name}.Dockerfile.dockerignore").exists()
    default = re.search(r"ARG TRAIN_SCRIPT=(\S+)", (DEPLOY / "images" / "trainer.Dockerfile").read_text())
    assert (ROOT / default.group(1)).exists()
    controller = (DEPLOY / "images" / "controller.Dockerfile").read_text()
    assert "/usr/local/bin/fthsdp-grpc-health" in controller  # the production readiness probe
    trainer = (DEPLOY / "images" / "trainer.Dockerfile").read_text()
    extras = re.search(r"^ARG EXTRAS=(\S+)", trainer, re.M).group(1).split(",")
    assert {"train", "cuda"} <= set(extras) and '"${WHEEL}[${EXTRAS}]"' in trainer  # FTAR on CUDA imports cupy
    assert "HOME=/home/fthsdp" in trainer and "--home-dir /home/fthsdp" in trainer


def _labels(obj: dict) -> dict:
    return obj["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("rel", OVERLAYS)
def test_only_pods_of_the_job_reach_the_trainer_ports(rel):
    docs = render(rel)
    policy = _by(docs, "NetworkPolicy", "fthsdp-trainers")
    trainers = [o for o in docs if o["kind"] == "DaemonSet"]  # the trainers run in the agent pods
    assert all(_selects(policy["spec"]["podSelector"], _labels(o)) for o in trainers)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    peers = [p for rule in policy["spec"]["ingress"] for p in rule["from"]]
    assert peers and all(set(p) == {"podSelector"} for p in peers), "trainer ports open beyond the namespace"
    for o in trainers:
        assert any(_selects(p["podSelector"], _labels(o)) for p in peers), o["metadata"]["name"]
    for other in (_by(docs, "StatefulSet", "fthsdp-controller"), _by(docs, "StatefulSet", "fthsdp-etcd")):
        assert not any(_selects(p["podSelector"], _labels(other)) for p in peers), other["metadata"]["name"]


@pytest.mark.parametrize("rel", OVERLAYS)
def test_etcd_speaks_tls_exactly_when_the_controller_dials_it_with_tls(rel):
    docs = render(rel)
    etcd_args = _by(docs, "StatefulSet", "fthsdp-etcd")["spec"]["template"]["spec"]["containers"][0]["args"]
    controller_args = _by(docs, "StatefulSet", "fthsdp-controller")["spec"]["template"]["spec"]["containers"][0]["args"]
    endpoints = _by(docs, "ConfigMap", "fthsdp-controller")["data"]["etcd_endpoints"].split(",")
    client = {a.split("=")[0] for a in controller_args if a.startswith("--etcd-")}
    if any(a.startswith("--cert-file=") for a in etcd_args):
        assert "--client-cert-auth" in etcd_args and all(e.startswith("https://") for e in endpoints)
        assert client == {"--etcd-ca-file", "--etcd-cert-file", "--etcd-key-file"}
        assert any(a.startswith("--listen-client-urls=https://") for a in etcd_args)
    else:
        assert not client and not any(e.startswith("https://") for e in endpoints)
    assert (rel == "kustomize/overlays/production") == bool(client)


#: The Secrets each component may mount, and those it must: what it needs and nothing more.
SECRETS_ALLOWED = {
    "controller": {"fthsdp-admin-token", "fthsdp-job-secret", "fthsdp-read-token", "fthsdp-controller-tls",
                   "fthsdp-etcd-client-tls"},
    "agent": {"fthsdp-job-secret", "fthsdp-client-tls"},
    "etcd": {"fthsdp-etcd-tls"},
}
SECRETS_REQUIRED = {"controller": {"fthsdp-admin-token", "fthsdp-job-secret"}, "agent": {"fthsdp-job-secret"}}


def _component(obj: dict) -> str:
    labels = obj["metadata"].get("labels", {})
    component = labels.get("app.kubernetes.io/component", "")
    return "agent" if component.startswith("agent") else component or obj["metadata"]["name"]


@pytest.mark.parametrize("rel", OVERLAYS)
def test_every_pod_mounts_the_secrets_it_uses_and_no_others(rel):
    """Each workload mounts only the Secrets its component may hold (an agent never the admin
    token or a server key, the controller never a client certificate), each mounted Secret is
    named by one of its container's flags or variables (nothing mounted unused), and the
    controller and the agents get the job secret."""
    for obj in render(rel):
        spec = _pod_spec(obj)
        if spec is None:
            continue
        component = next((c for c in SECRETS_ALLOWED if _component(obj).startswith(c)), _component(obj))
        secret_volumes = {v["name"]: v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
        mounted = set()
        for _, c in _containers(obj):
            said = " ".join(c.get("args", []) + c.get("command", []) +
                            [e.get("value", "") for e in c.get("env", [])] +
                            [" ".join(p.get("exec", {}).get("command", [])) for p in
                             (c.get("readinessProbe", {}), c.get("livenessProbe", {}))])
            for m in c.get("volumeMounts", []):
                if m["name"] in secret_volumes:
                    mounted.add(secret_volumes[m["name"]])
                    assert m.get("readOnly"), (rel, obj["metadata"]["name"], m)
                    assert m["mountPath"] in said, (f"{rel}: {obj['metadata']['name']} mounts "
                                                    f"{secret_volumes[m['name']]} at {m['mountPath']} but no flag "
                                                    f"or variable names it")
        assert mounted <= SECRETS_ALLOWED.get(component, set()), (rel, obj["metadata"]["name"], mounted)
        assert SECRETS_REQUIRED.get(component, set()) <= mounted, (rel, obj["metadata"]["name"], mounted)
        assert set(secret_volumes.values()) == mounted, (rel, obj["metadata"]["name"], "a volume nobody mounts")

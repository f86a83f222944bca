"""The rendered manifests against the real command lines and settings they feed.

- TLS: when an overlay's controller serves gRPC over TLS, every gRPC client of it (both agent
  DaemonSets, whose pods run the trainers too) has the CA (and, for mTLS, a client certificate
  and key) from a read-only Secret volume; when it does not, none has.
- The agent and controller argument lists parse with `fthsdp agent` / `fthsdp controller`,
  and an agent hands its TLS files to its trainers as FTHSDP_TLS_* (agent/env.py).
- controller.json of every ConfigMap loads through ControllerSettings.from_file (unknown keys
  are refused there), with the ConfigMap's replicas and min_replicas.
- Readiness asks gRPC health for a service the controller actually sets (SERVING on the leader
  only), the same one in every overlay, and deploy/README.md says so.
- End to end: the production controller, an agent and the exec readiness probe, each built from
  its rendered arguments, talk mTLS with certificates shaped as deploy/README.md asks.
"""

from __future__ import annotations

import datetime
import os
import re
import time
from pathlib import Path

import httpx
import pytest
import yaml

from controller.service.server import SERVICE_NAME
from controller.settings import ControllerSettings

from .test_manifests import DEPLOY, OVERLAYS, _by, _load_all, render

_saved_env = dict(os.environ)
from agent import env as agent_env  # noqa: E402
from agent.policy import Placement  # noqa: E402
from agent import main as agent_main  # noqa: E402  (sets GRPC_ENABLE_FORK_SUPPORT; undone below)

if "GRPC_ENABLE_FORK_SUPPORT" not in _saved_env:
    os.environ.pop("GRPC_ENABLE_FORK_SUPPORT", None)

TLS_FLAGS = ("--tls-ca-file", "--tls-cert-file", "--tls-key-file")
TLS_ENV = {"--tls-ca-file": "FTHSDP_TLS_CA_FILE", "--tls-cert-file": "FTHSDP_TLS_CERT_FILE",
           "--tls-key-file": "FTHSDP_TLS_KEY_FILE", "--tls-server-name": "FTHSDP_TLS_SERVER_NAME"}
SECRET_KEYS = {"ca.crt", "tls.crt", "tls.key"}  # the keys deploy/README.md documents
MOUNT_ROOT = "/etc/fthsdp/"


def _container(obj: dict, name: str | None = None) -> dict:
    containers = obj["spec"]["template"]["spec"]["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def _flags(args: list[str]) -> dict[str, str]:
    """`--flag=value` options before a `--` (what follows is the agent's trainer command)."""
    if "--" in args:
        args = args[:args.index("--")]
    return dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)


def _controller_tls(docs: list[dict]) -> tuple[bool, bool]:
    """(TLS on, client certificates required) for the overlay's controller."""
    flags = _flags(_container(_by(docs, "StatefulSet", "fthsdp-controller"), "controller")["args"])
    return "--tls-cert-file" in flags, "--tls-client-ca-file" in flags


def _clients(rel: str) -> list[tuple[dict, dict[str, str]]]:
    """Every gRPC client of the controller with the TLS files it names: {flag: path}."""
    out = []
    for ds in (d for d in render(rel) if d["kind"] == "DaemonSet"):
        c = _container(ds, "agent")
        assert c["command"] == ["fthsdp", "agent"]
        flags = _flags(c["args"])
        out.append((ds, {f: flags[f] for f in TLS_FLAGS if f in flags}))
        after = c["args"][c["args"].index("--") + 1:] if "--" in c["args"] else []
        assert not any(a.startswith("--tls-") for a in after), "TLS flags after `--` go to the trainer"
    assert len(out) == 2  # the two agent DaemonSets
    return out


def _secret_file(obj: dict, path: str) -> dict:
    """The Secret volume that provides `path` in obj's pod, mounted read-only; its volume."""
    pod = obj["spec"]["template"]["spec"]
    name = obj["metadata"]["name"]
    assert "BEGIN" not in path and path.startswith(MOUNT_ROOT), f"{name}: {path!r} is not a file path"
    mounts = [m for c in pod["containers"] for m in c.get("volumeMounts", [])
              if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"{name}: {path} is not under exactly one volume mount"
    (mount,) = mounts
    assert mount.get("readOnly") is True, f"{name}: {mount['mountPath']} is writable"
    assert "subPath" not in mount, f"{name}: subPath mounts are never refreshed (rotation)"
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert "secret" in volume, f"{name}: {path} is not from a Secret"
    assert "items" not in volume["secret"] and not volume["secret"].get("optional")
    assert Path(path).name in SECRET_KEYS and Path(path).parent == Path(mount["mountPath"])
    return volume


# ---------------------------------------------------------------- TLS on every client


@pytest.mark.parametrize("rel", OVERLAYS)
def test_every_controller_client_uses_tls_exactly_when_the_controller_does(rel):
    tls, mtls = _controller_tls(render(rel))
    for obj, files in _clients(rel):
        name = f"{rel}: {obj['kind']}/{obj['metadata']['name']}"
        if not tls:
            assert not files, f"{name} dials a plaintext controller with TLS"
            continue
        want = set(TLS_FLAGS) if mtls else {"--tls-ca-file"}
        assert want <= set(files), f"{name} lacks {sorted(want - set(files))}"
        secrets = {_secret_file(obj, path)["secret"]["secretName"] for path in files.values()}
        assert len(secrets) == 1, f"{name}: CA, certificate and key from one Secret, got {secrets}"
        assert secrets != {"fthsdp-controller-tls"}, f"{name} must not hold the controller's key"


def test_production_turns_mtls_on():
    assert _controller_tls(render("kustomize/overlays/production")) == (True, True)
    assert _controller_tls(render("kustomize/overlays/dev")) == (False, False)


def test_production_agent_args_are_the_base_args_plus_tls():
    """A patch replaces `args` whole: it must not drift from base/agent.yaml. (The dev overlay
    changes --slots and --labels on purpose.)"""
    base = render("kustomize/base")
    for ds in (d for d in render("kustomize/overlays/production") if d["kind"] == "DaemonSet"):
        args = _container(ds, "agent")["args"]
        kept = [a for a in args if a.split("=", 1)[0] not in TLS_ENV]
        assert kept == _container(_by(base, "DaemonSet", ds["metadata"]["name"]), "agent")["args"]


# ---------------------------------------------------------------- real command lines


def _expand(c: dict, docs: list[dict]) -> list[str]:
    """c's args with $(VAR) replaced as kubelet does, from literal env or ConfigMap keys."""
    values = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        values[e["name"]] = e["value"] if "value" in e else (
            _by(docs, "ConfigMap", ref["name"])["data"][ref["key"]] if ref else f"<{e['name']}>")
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in c["args"]]


def _localize(args: list[str], tmp_path: Path) -> list[str]:
    """Mounted files (/etc/fthsdp/...) -> files under tmp_path, created empty if missing."""
    out = []
    for a in args:
        m = re.search(re.escape(MOUNT_ROOT) + r"\S+", a)
        if m:
            local = tmp_path / m.group(0)[len(MOUNT_ROOT):]
            local.parent.mkdir(parents=True, exist_ok=True)
            if not local.exists():
                local.write_text("{}" if local.suffix == ".json" else "x")
            a = a.replace(m.group(0), str(local))
        out.append(a)
    return out


@pytest.mark.parametrize("name", ["fthsdp-agent", "fthsdp-agent-spare"])
@pytest.mark.parametrize("rel", OVERLAYS)
def test_agent_args_parse_and_trainers_get_the_agents_tls_files(rel, name, tmp_path):
    c = _container(_by(render(rel), "DaemonSet", name), "agent")
    args = _localize(c["args"], tmp_path)
    settings = agent_main.parse(args)
    assert settings.command == ("python", "/opt/fthsdp/train.py")  # the trainer image's script
    env = agent_env.trainer_environment({}, Placement("r0", 0, 1), host_id="h", job_id="", controller="c:1",
                                        tls=settings.tls)
    given = {TLS_ENV[f]: v for f, v in _flags(args).items() if f in TLS_ENV}
    assert {k: v for k, v in env.items() if k.startswith("FTHSDP_TLS_")} == given
    assert settings.tls.enabled == _controller_tls(render(rel))[0]


@pytest.mark.parametrize("rel", OVERLAYS)
def test_controller_args_parse_and_bind_all_interfaces(rel, tmp_path):
    from controller import main as controller_main

    docs = render(rel)
    c = _container(_by(docs, "StatefulSet", "fthsdp-controller"), "controller")
    args = controller_main.parse_args(_localize(_expand(c, docs), tmp_path))
    assert args.host == "0.0.0.0"  # the default, 127.0.0.1, is unreachable from Services and kubelet
    assert args.grpc_port == 50051 and args.http_port == 8080
    # the leaders' quorum port is fixed, on the container and on the Service they reach gRPC by
    assert args.quorum_port == 50052 and not args.no_quorum_port
    assert {"name": "quorum", "containerPort": 50052, "protocol": "TCP"} in c["ports"]
    service = _by(docs, "Service", "fthsdp-controller-grpc")
    assert {"name": "quorum", "port": 50052, "targetPort": "quorum", "protocol": "TCP"} in service["spec"]["ports"]


# ---------------------------------------------------------------- controller.json


def _check_configmap(data: dict, tmp_path: Path) -> ControllerSettings:
    path = tmp_path / "controller.json"
    path.write_text(data["controller.json"])
    return ControllerSettings.from_file(path, replicas=int(data["replicas"]),
                                        min_replicas=int(data["min_replicas"]))


def test_base_configmap_loads_as_controller_settings(tmp_path):
    (cm,) = _load_all((DEPLOY / "kustomize" / "common" / "configmap.yaml").read_text())
    settings = _check_configmap(cm["data"], tmp_path)
    for key, value in yaml.safe_load(cm["data"]["controller.json"]).items():
        assert getattr(settings, key) == value


@pytest.mark.parametrize("rel", OVERLAYS)
def test_rendered_configmap_loads_as_controller_settings(rel, tmp_path):
    _check_configmap(_by(render(rel), "ConfigMap", "fthsdp-controller")["data"], tmp_path)


def test_an_unknown_configmap_key_is_refused(tmp_path):
    """The check above would catch drift: the loader refuses names it does not know."""
    (cm,) = _load_all((DEPLOY / "kustomize" / "common" / "configmap.yaml").read_text())
    data = dict(cm["data"], **{"controller.json": '{"join_timeout": 30}'})
    with pytest.raises(ValueError, match="unknown keys: join_timeout"):
        _check_configmap(data, tmp_path)


# ---------------------------------------------------------------- readiness


def test_every_serving_controller_is_ready_and_https_is_probed_as_https():
    """Readiness is the REST port's /healthz, which standbys answer too (they serve reads): the
    StatefulSet shows 3/3 and the PDB can let one go at a time. HTTPS exactly when it serves
    HTTPS. gRPC health (SERVING on the leader only) is no readiness: it would hold standbys
    out of the read Services."""
    for rel in OVERLAYS:
        c = _container(_by(render(rel), "StatefulSet", "fthsdp-controller"), "controller")
        probe = c["readinessProbe"]
        assert set(probe) >= {"httpGet"} and "grpc" not in probe and "exec" not in probe, rel
        assert probe["httpGet"]["path"] == "/healthz" and probe["httpGet"]["port"] == "http", rel
        https = "--http-tls-cert-file" in _flags(c["args"])
        assert probe["httpGet"].get("scheme", "HTTP") == ("HTTPS" if https else "HTTP"), rel
    readme = (DEPLOY / "README.md").read_text()
    assert f"`{SERVICE_NAME}`" in readme and "NOT_SERVING" in readme and "3/3" in readme


# ---------------------------------------------------------------- end to end over mTLS


def _pki(dir_: Path) -> dict[str, Path]:
    """CA, controller certificate (names as deploy/README.md asks) and one client certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem, cert, key):
        dir_.mkdir(parents=True, exist_ok=True)
        (dir_ / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (dir_ / f"{stem}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

    def builder(cn, issuer, key):
        return (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(issuer))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(hours=1)))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = builder("fthsdp-ca", "fthsdp-ca", ca_key).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256())
    write("ca", ca, ca_key)
    for stem, cn, usages, sans in (
            ("controller", "fthsdp-controller-grpc",
             [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
             ["fthsdp-controller-grpc", "fthsdp-controller-grpc.fthsdp.svc"]),
            ("client", "fthsdp-agent", [ExtendedKeyUsageOID.CLIENT_AUTH], [])):
        key = ec.generate_private_key(ec.SECP256R1())
        b = builder(cn, "fthsdp-ca", key).add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(s) for s in sans]), critical=False)
        write(stem, b.sign(ca_key, hashes.SHA256()), key)
    return {"ca": dir_ / "ca.crt"}


def _secret_dir(tmp_path: Path, pki: Path, stem: str) -> Path:
    """A Secret's mount as deploy/README.md creates it: tls.crt, tls.key, ca.crt."""
    out = tmp_path / stem
    out.mkdir()
    for key, src in (("tls.crt", f"{stem}.crt"), ("tls.key", f"{stem}.key"), ("ca.crt", "ca.crt")):
        (out / key).write_bytes((pki / src).read_bytes())
    return out


async def test_production_controller_agent_and_probe_talk_mtls(tmp_path):
    import asyncio

    from controller import main as controller_main
    from protos import controller_pb2 as pb
    from protos import controller_pb2_grpc as pbg
    from protos import credentials, job_secret
    from protos.dial import aio_channel

    spec = importlib_probe()
    docs = render("kustomize/overlays/production")
    pki = tmp_path / "pki"
    _pki(pki)
    server_dir, client_dir = _secret_dir(tmp_path, pki, "controller"), _secret_dir(tmp_path, pki, "client")
    settings = tmp_path / "controller.json"
    settings.write_text(_by(docs, "ConfigMap", "fthsdp-controller")["data"]["controller.json"])

    c = _container(_by(docs, "StatefulSet", "fthsdp-controller"), "controller")
    secret_dir = tmp_path / "job-secret"
    secret_dir.mkdir()
    secret = job_secret.generate()
    (secret_dir / "secret").write_text(secret)
    args = [a.replace("/etc/fthsdp/tls/", f"{server_dir}/").replace("/etc/fthsdp/controller.json", str(settings))
            .replace("/etc/fthsdp/job-secret/", f"{secret_dir}/")
            for a in _expand(c, docs) if not a.startswith(("--etcd", "--admin-token-file=", "--read-token-file="))]
    args = [a for a in args if not a.startswith(("--grpc-port=", "--http-port=", "--host="))]
    server = controller_main.build_server(controller_main.parse_args(
        args + ["--host=127.0.0.1", "--grpc-port=0", "--http-port=0"]))
    await server.start()
    try:
        await server.wait_leading(10)
        port = server.grpc_address.rpartition(":")[2]

        agent = _container(_by(docs, "DaemonSet", "fthsdp-agent-spare"), "agent")
        agent_args = [a.replace("/etc/fthsdp/tls/", f"{client_dir}/").replace("$(POD_IP)", "10.0.0.7")
                      for a in agent["args"]]
        s = agent_main.parse(agent_args)
        assert s.controller_addresses == tuple(f"fthsdp-controller-{n}.fthsdp-controller:50051" for n in range(3))
        # Each pod name resolves to its pod in a cluster; here the leader is 127.0.0.1:port. The
        # agent checks the name the certificate bears, whichever pod it dials.
        assert s.tls.server_name == "fthsdp-controller-grpc"
        async with aio_channel(f"127.0.0.1:{port}", s.tls) as channel:
            reply = await pbg.ControllerStub(channel).RegisterAgent(pb.RegisterAgentRequest(
                host_id="node-1", incarnation="i1", spare=s.spare, address=s.advertise_address,
                rendezvous_port=29500, coordinator_port=29501, proof=credentials.registration_proof(
                    job_secret.parse(secret, "the test"), "node-1", "i1", time.time())), timeout=5)
        assert "spare" in reply.reason

        # Readiness: HTTPS on the REST port (kubelet checks no certificate; we check its chain,
        # not its name: the probe dials the pod's IP)
        import ssl

        probe = c["readinessProbe"]["httpGet"]
        chain = ssl.create_default_context(cafile=str(server_dir / "ca.crt"))
        chain.check_hostname = False
        answer = await asyncio.to_thread(lambda: httpx.get(f"{server.http_url}{probe['path']}", verify=chain,
                                                           timeout=5))
        assert server.http_url.startswith("https://") and answer.json()["ok"] is True
        # Which pod leads: fthsdp-grpc-health against the leader-only health service, over mTLS.
        assert await asyncio.to_thread(spec.main, [
            f"--addr=127.0.0.1:{port}", f"--service={SERVICE_NAME}", "--server-name=fthsdp-controller-grpc",
            f"--ca-file={server_dir}/ca.crt", f"--cert-file={server_dir}/tls.crt",
            f"--key-file={server_dir}/tls.key"]) == 0
        await server.stop()
        server = None
    finally:
        if server is not None:
            await server.stop()


def importlib_probe():
    import importlib.util

    path = DEPLOY / "images" / "grpc_health_probe.py"
    spec = importlib.util.spec_from_file_location("grpc_health_probe_e2e", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

"""The rdma overlay is production plus the fabric, and nothing else: a Multus network, the RDMA
device, IPC_LOCK (and so the privileged Pod Security level), NCCL's settings; on agent pods only."""

from __future__ import annotations

import copy

from .test_manifests import _by, render

FABRIC_ENV = {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_GID_INDEX", "NCCL_NET_GDR_LEVEL", "NCCL_DEBUG"}


def _without_fabric(doc: dict) -> dict:
    """`doc` with what the rdma overlay adds taken out again."""
    doc = copy.deepcopy(doc)
    if doc["kind"] == "Namespace":
        doc["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "restricted"
    if doc["kind"] == "DaemonSet":
        template = doc["spec"]["template"]
        assert template["metadata"].pop("annotations") == {"k8s.v1.cni.cncf.io/networks": "fthsdp-rdma"}
        [c] = template["spec"]["containers"]
        assert {e["name"] for e in c["env"]} >= FABRIC_ENV
        c["env"] = [e for e in c["env"] if e["name"] not in FABRIC_ENV]
        for part in ("requests", "limits"):
            assert c["resources"][part].pop("rdma/rdma_shared_device_a") == "1"
        assert c["securityContext"]["capabilities"].pop("add") == ["IPC_LOCK"]
    return doc


def test_rdma_is_production_plus_the_fabric():
    production, rdma = render("kustomize/overlays/production"), render("kustomize/overlays/rdma")
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, rdma)) == sorted(map(key, production))
    for doc in rdma:
        assert _without_fabric(doc) == _by(production, *key(doc)), key(doc)
    assert _by(rdma, "Namespace", "fthsdp")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"

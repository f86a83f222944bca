"""The perimeter's transport: TLS on the REST port and on etcd, etcd auth. A client without TLS
(or without the right credentials) gets nowhere; the right one gets through."""

from __future__ import annotations

import asyncio
import ssl
import uuid

import aetcd.rpc
import grpc
import httpx
import pytest

from controller.etcd_store import EtcdStore, EtcdStoreSettings
from controller.store import StoreError
from tests.certs import Authority
from tests.etcd_server import EtcdServer, EtcdTls
from tests.waiting import wait_for_async, wait_for_blocking

from .harness import start_controller

pytestmark = pytest.mark.slow
BOUND_S = 30
FAST = dict(op_timeout_s=2.0, poll_interval_s=0.05, reconnect_backoff_max_s=0.2)


@pytest.fixture
def pki(tmp_path):
    ca = Authority(tmp_path, "fthsdp-ca")
    return {"ca": ca, "server": ca.issue("server", "controller", server=True),
            "client": ca.issue("client", "controller-client", server=False),
            "rogue": Authority(tmp_path, "rogue-ca").issue("rogue", "rogue", server=False)}


async def store_round_trip(store: EtcdStore) -> None:
    lead = await asyncio.wait_for(store.campaign("c", ttl_s=2), 10)
    revision = await store.cas("k", b"v", 0, lead)
    assert revision and (await store.get("k")).value == b"v"
    await store.resign(lead)


def test_rest_over_https_refuses_plain_http(pki):
    server = pki["server"]
    ctl = start_controller("--http-tls-cert-file", str(server.cert), "--http-tls-key-file", str(server.key))
    try:
        assert ctl.http.startswith("https://")
        plain = ctl.http.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{plain}/api/v1/job", timeout=5)
        with pytest.raises(httpx.ConnectError):  # a server certificate from nobody it trusts
            httpx.get(f"{ctl.http}/api/v1/job", timeout=5)
        context = ssl.create_default_context(cafile=str(pki["ca"].pem.cert))
        reply = httpx.get(f"{ctl.http}/api/v1/job", timeout=5, verify=context)
        assert reply.status_code == 200 and reply.json()["job_id"] == "sec"
    finally:
        ctl.stop()


def test_rest_tls_flags_are_checked(pki):
    with pytest.raises(RuntimeError):  # the controller exits (code 2) without serving
        start_controller("--http-tls-cert-file", str(pki["server"].cert), timeout_s=20)


@pytest.fixture
def etcd_mtls(pki):
    server = pki["server"]
    with EtcdServer.start_new(tls=EtcdTls(server.cert, server.key, pki["ca"].pem.cert, client_ca=True)) as etcd:
        yield etcd


async def test_etcd_over_mtls_and_clients_without_it(etcd_mtls, pki):
    endpoint, ca, client = etcd_mtls.url, str(pki["ca"].pem.cert), pki["client"]
    good = EtcdStore([endpoint], f"/fthsdp-tls/{uuid.uuid4().hex}", EtcdStoreSettings(
        **FAST, ca_file=ca, cert_file=str(client.cert), key_file=str(client.key)))
    rogue = pki["rogue"]
    bad = {
        "plaintext": EtcdStore([etcd_mtls.endpoint], "/p", EtcdStoreSettings(**FAST)),
        "no client certificate": EtcdStore([endpoint], "/p", EtcdStoreSettings(**FAST, ca_file=ca)),
        "a certificate from another CA": EtcdStore([endpoint], "/p", EtcdStoreSettings(
            **FAST, ca_file=ca, cert_file=str(rogue.cert), key_file=str(rogue.key))),
    }
    try:
        await store_round_trip(good)
        for what, store in bad.items():
            with pytest.raises(StoreError):
                await store.get("k")
    finally:
        for store in (good, *bad.values()):
            await store.close()


async def test_a_controller_leads_through_etcd_mtls(etcd_mtls, pki):
    client = pki["client"]
    ctl = start_controller("--etcd", etcd_mtls.url, "--etcd-ca-file", str(pki["ca"].pem.cert),
                           "--etcd-cert-file", str(client.cert), "--etcd-key-file", str(client.key))
    try:
        await wait_for_blocking(lambda: httpx.get(f"{ctl.http}/api/v1/job", timeout=2).json()["this_controller_leads"],
                                BOUND_S, "the controller to lead through etcd over mTLS")
    finally:
        ctl.stop()


def test_etcd_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="needs both a cert and a key file"):
        EtcdStoreSettings(ca_file=None, cert_file="c").validate()
    with pytest.raises(ValueError, match="needs both a user and a password"):
        EtcdStoreSettings(username="u").validate()
    with pytest.raises(ValueError, match=f"TLS file {tmp_path}/none.pem does not exist \\(TLS to etcd\\)"):
        EtcdStoreSettings(ca_file=str(tmp_path / "none.pem")).validate()
    with pytest.raises(ValueError, match="plain http, but TLS is on"):
        EtcdStore(["http://a:1", "https://b:1"], "/p")
    assert "s3cret" not in repr(EtcdStoreSettings(username="u", password="s3cret"))


PREFIX = "/fthsdp/"  # where controllers keep their jobs


@pytest.fixture
def etcd_auth():
    """etcd with auth on: root, and a user `ctl` that may read and write PREFIX only. Tokens
    live one second, so a store must log in again."""
    with EtcdServer.start_new(extra_args=("--auth-token-ttl", "1")) as etcd:
        for args in (["role", "add", "root"], ["user", "add", "root", "--new-user-password=rootpw"],
                     ["user", "grant-role", "root", "root"], ["role", "add", "fthsdp"],
                     ["role", "grant-permission", "fthsdp", "readwrite", "--prefix=true", PREFIX],
                     ["user", "add", "ctl", "--new-user-password=ctlpw"], ["user", "grant-role", "ctl", "fthsdp"],
                     ["auth", "enable"]):
            etcd.etcdctl(*args)
        yield etcd


async def test_etcd_auth_with_expiring_tokens(etcd_auth):
    prefix = f"{PREFIX}auth-{uuid.uuid4().hex}"
    store = EtcdStore([etcd_auth.endpoint], prefix, EtcdStoreSettings(**FAST, username="ctl", password="ctlpw"))
    wrong = EtcdStore([etcd_auth.endpoint], prefix, EtcdStoreSettings(**FAST, username="ctl", password="nope"))
    anonymous = EtcdStore([etcd_auth.endpoint], prefix, EtcdStoreSettings(**FAST))
    outside = EtcdStore([etcd_auth.endpoint], "/elsewhere", EtcdStoreSettings(**FAST, username="ctl", password="ctlpw"))
    try:
        await store_round_trip(store)
        token = store._clients[0].metadata
        with pytest.raises(StoreError, match="authentication failed"):
            await wrong.get("k")
        with pytest.raises(StoreError):
            await anonymous.get("k")
        with pytest.raises(StoreError, match="permission denied"):
            await outside.get("k")

        async def token_expired() -> bool:
            async with grpc.aio.insecure_channel(etcd_auth.endpoint) as channel:
                try:
                    await aetcd.rpc.KVStub(channel).Range(aetcd.rpc.RangeRequest(key=f"{prefix}/kv/k".encode()),
                                                          metadata=token, timeout=2)
                except grpc.aio.AioRpcError as exc:
                    return "invalid auth token" in (exc.details() or "")
                return False
        # Each look uses the token (and so renews it): look less often than it lives.
        await wait_for_async(token_expired, 15, "etcd to expire the store's token", every_s=2.5)
        assert (await store.get("k")).value == b"v"  # logged in again by itself
    finally:
        for s in (store, wrong, anonymous, outside):
            await s.close()


async def test_a_controller_leads_with_etcd_auth(etcd_auth, tmp_path):
    password = tmp_path / "etcd-password"
    password.write_text("ctlpw\n")
    ctl = start_controller("--etcd", etcd_auth.endpoint, "--etcd-user", "ctl", "--etcd-password-file", str(password))
    try:
        await wait_for_blocking(lambda: httpx.get(f"{ctl.http}/healthz", timeout=2).json()["leading"], BOUND_S,
                                "the controller to lead with etcd auth")
    finally:
        ctl.stop()

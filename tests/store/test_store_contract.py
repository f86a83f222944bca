"""The Store contract, one suite for every implementation (MemoryStore, EtcdStore), plus the
etcd-only behaviours: lease expiry deposes a stalled leader, and the client survives an etcd
restart. Every wait is bounded with asyncio.wait_for; nothing sleeps to let time pass."""

from __future__ import annotations

import asyncio
import uuid

import aetcd
import pytest

from controller.etcd_store import EtcdStore, EtcdStoreSettings, parse_endpoint
from controller.store import Leadership, MemoryStore, StoreError, Versioned
from tests.etcd_server import EtcdServer
from tests.sockets import refused_address

WAIT_S = 10.0  # bound on waits that should end quickly
FAST = EtcdStoreSettings(op_timeout_s=1.0, poll_interval_s=0.05, reconnect_backoff_max_s=0.2)


class Backend:
    """Opens handles on one shared store: what two controller processes would each hold."""

    def __init__(self, kind: str, endpoint: str | None) -> None:
        self.kind = kind
        self.endpoint = endpoint
        self.prefix = f"/fthsdp-test/{uuid.uuid4().hex}"
        self._memory = MemoryStore() if kind == "memory" else None
        self._opened: list = []

    def open(self):
        if self._memory is not None:
            return self._memory
        store = EtcdStore([self.endpoint], self.prefix, FAST)
        self._opened.append(store)
        return store

    async def close(self) -> None:
        for store in self._opened + ([self._memory] if self._memory else []):
            try:
                await store.close()
            except StoreError:
                pass


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
async def backend(request):
    endpoint = request.getfixturevalue("etcd").endpoint if request.param == "etcd" else None
    backend = Backend(request.param, endpoint)
    yield backend
    await backend.close()


async def bounded(awaitable, timeout_s: float = WAIT_S):
    return await asyncio.wait_for(awaitable, timeout_s)


# -- the contract, for every store ---------------------------------------------------------


async def test_get_absent_key(backend):
    assert await backend.open().get("nothing-here") == Versioned(None, 0)


async def test_cas_creates_then_updates(backend):
    store = backend.open()
    lead = await bounded(store.campaign("a", ttl_s=5))
    rev1 = await store.cas("k", b"v1", 0, lead)
    assert rev1 is not None and rev1 > 0
    assert await store.get("k") == Versioned(b"v1", rev1)
    rev2 = await store.cas("k", b"v2", rev1, lead)
    assert rev2 is not None and rev2 > rev1
    assert await store.get("k") == Versioned(b"v2", rev2)


async def test_cas_with_stale_revision_is_refused(backend):
    store = backend.open()
    lead = await bounded(store.campaign("a", ttl_s=5))
    rev1 = await store.cas("k", b"v1", 0, lead)
    rev2 = await store.cas("k", b"v2", rev1, lead)
    assert await store.cas("k", b"stale", rev1, lead) is None
    assert await store.cas("k", b"create-again", 0, lead) is None
    assert await store.cas("k", b"future", rev2 + 100, lead) is None
    assert await store.get("k") == Versioned(b"v2", rev2)


async def test_revisions_are_per_key(backend):
    store = backend.open()
    lead = await bounded(store.campaign("a", ttl_s=5))
    ra = await store.cas("a", b"1", 0, lead)
    rb = await store.cas("b", b"1", 0, lead)
    assert await store.cas("a", b"2", ra, lead) is not None
    assert await store.cas("b", b"2", rb, lead) is not None  # b's revision moved only with b


async def test_two_leaders_cannot_coexist(backend):
    first, second = backend.open(), backend.open()
    lead_a = await bounded(first.campaign("a", ttl_s=5))
    campaign_b = asyncio.ensure_future(second.campaign("b", ttl_s=5))
    done, _ = await asyncio.wait({campaign_b}, timeout=0.5)
    assert not done, "a second candidate led while the first still held its leadership"
    assert await second.leader() == "a"
    await first.resign(lead_a)
    lead_b = await bounded(campaign_b)
    assert lead_b.candidate == "b" and not lead_b.lost.is_set()
    assert await first.leader() == "b"


async def test_resigned_leader_cannot_write(backend):
    first, second = backend.open(), backend.open()
    lead_a = await bounded(first.campaign("a", ttl_s=5))
    rev = await first.cas("k", b"from-a", 0, lead_a)
    await first.resign(lead_a)
    assert lead_a.lost.is_set()
    assert await first.cas("k", b"late-a", rev, lead_a) is None
    assert await first.get("k") == Versioned(b"from-a", rev)

    lead_b = await bounded(second.campaign("b", ttl_s=5))
    assert await first.cas("k", b"late-a", rev, lead_a) is None
    rev_b = await second.cas("k", b"from-b", rev, lead_b)
    assert rev_b is not None
    assert await first.get("k") == Versioned(b"from-b", rev_b)


async def test_leader_names_the_leader(backend):
    store = backend.open()
    assert await store.leader() is None
    lead = await bounded(store.campaign("controller-1", ttl_s=5))
    assert await store.leader() == "controller-1"
    await store.resign(lead)
    assert await store.leader() is None


async def test_a_leadership_the_store_did_not_grant_is_refused(backend):
    store = backend.open()
    await bounded(store.campaign("a", ttl_s=5))
    forged = Leadership(candidate="a", fence=object())
    assert await store.cas("k", b"v", 0, forged) is None
    assert await store.get("k") == Versioned(None, 0)


# -- etcd only ----------------------------------------------------------------------------

etcd_only = pytest.mark.etcd


@pytest.fixture
async def etcd_backend(etcd):
    backend = Backend("etcd", etcd.endpoint)
    yield backend
    await backend.close()


@etcd_only
async def test_lease_expiry_deposes_a_stalled_leader(etcd_backend):
    first, second = etcd_backend.open(), etcd_backend.open()
    lead_a = await bounded(first.campaign("a", ttl_s=1))
    rev = await first.cas("k", b"from-a", 0, lead_a)
    campaign_b = asyncio.ensure_future(second.campaign("b", ttl_s=5))

    first.pause_keepalive(lead_a)  # as if a's process stalled
    await bounded(lead_a.lost.wait())
    lead_b = await bounded(campaign_b)  # etcd expired a's lease and deleted its key

    assert await first.cas("k", b"late-a", rev, lead_a) is None
    rev_b = await second.cas("k", b"from-b", rev, lead_b)
    assert rev_b is not None
    assert await second.get("k") == Versioned(b"from-b", rev_b)
    assert await second.leader() == "b"


@etcd_only
async def test_server_side_fencing_refuses_a_deposed_leader_that_has_not_noticed(etcd_backend):
    """Leadership.lost is only a hint: the transaction itself checks the election key."""
    first, second = etcd_backend.open(), etcd_backend.open()
    lead_a = await bounded(first.campaign("a", ttl_s=5))
    rev = await first.cas("k", b"from-a", 0, lead_a)
    # An operator (or etcd) removes a's lease behind its back; b takes over at once.
    host, port = parse_endpoint(etcd_backend.endpoint)
    async with aetcd.Client(host=host, port=port, timeout=WAIT_S) as operator:
        await operator.revoke_lease(lead_a.fence.lease_id)
    lead_b = await bounded(second.campaign("b", ttl_s=5))
    # A copy of a's proof that has not heard the news (its keep-alive may have by now).
    unaware = Leadership(candidate="a", fence=lead_a.fence)
    assert await first.cas("k", b"late-a", rev, unaware) is None
    assert unaware.lost.is_set()  # the refused write told it why
    assert await first.get("k") == Versioned(b"from-a", rev)
    assert await second.cas("k", b"from-b", rev, lead_b) is not None


@etcd_only
async def test_keepalive_holds_leadership_past_the_ttl(etcd_backend):
    store = etcd_backend.open()
    lead = await bounded(store.campaign("a", ttl_s=2))
    rev = await store.cas("k", b"v", 0, lead)
    # Wait for three lease refreshes (each moves the deadline), i.e. past one TTL.
    fence = lead.fence
    for _ in range(3):
        before = fence.deadline
        await bounded(_until(lambda: fence.deadline > before))
    assert not lead.lost.is_set()
    assert await store.cas("k", b"v2", rev, lead) is not None


async def _until(predicate, interval_s: float = 0.02) -> None:
    while not predicate():
        await asyncio.sleep(interval_s)


@pytest.fixture
def own_etcd():
    """A private etcd for tests that stop it, so the shared one stays up."""
    server = EtcdServer.start_new()
    yield server
    server.close()


async def _recovers(call, timeout_s: float = WAIT_S):
    async def retry():
        while True:
            try:
                return await call()
            except StoreError:
                await asyncio.sleep(0.05)
    return await bounded(retry(), timeout_s)


@etcd_only
@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_store_survives_an_etcd_restart(own_etcd, how):
    store = EtcdStore([own_etcd.endpoint], "/fthsdp-test/restart", FAST)
    try:
        lead = await bounded(store.campaign("a", ttl_s=10))
        rev = await store.cas("k", b"before", 0, lead)

        own_etcd.stop() if how == "stop" else own_etcd.kill()
        with pytest.raises(StoreError):
            await store.get("k")
        with pytest.raises(StoreError):
            await store.cas("k", b"while-down", rev, lead)
        with pytest.raises(StoreError):
            await store.leader()

        own_etcd.start()
        assert await _recovers(lambda: store.get("k")) == Versioned(b"before", rev)
        assert await store.leader() == "a"
        assert not lead.lost.is_set()  # the lease outlived a short outage
        assert await store.cas("k", b"after", rev, lead) is not None
    finally:
        await store.close()


@etcd_only
async def test_a_paused_etcd_times_out_instead_of_hanging(own_etcd):
    store = EtcdStore([own_etcd.endpoint], "/fthsdp-test/pause",
                      EtcdStoreSettings(op_timeout_s=0.3, poll_interval_s=0.05))
    try:
        assert await store.get("k") == Versioned(None, 0)
        own_etcd.pause()
        with pytest.raises(StoreError):
            await bounded(store.get("k"), 5)
        own_etcd.resume()
        assert await _recovers(lambda: store.get("k")) == Versioned(None, 0)
    finally:
        own_etcd.resume()
        await store.close()


@etcd_only
async def test_campaign_waits_out_an_outage(own_etcd):
    store = EtcdStore([own_etcd.endpoint], "/fthsdp-test/outage", FAST)
    try:
        own_etcd.stop()
        campaign = asyncio.ensure_future(store.campaign("a", ttl_s=5))
        done, _ = await asyncio.wait({campaign}, timeout=0.3)
        assert not done
        own_etcd.start()
        lead = await bounded(campaign)
        assert await store.leader() == "a" and not lead.lost.is_set()
    finally:
        await store.close()


@etcd_only
async def test_a_second_endpoint_takes_over(etcd):
    dead = refused_address()
    store = EtcdStore([dead, etcd.endpoint], "/fthsdp-test/" + uuid.uuid4().hex, FAST)
    try:
        with pytest.raises(StoreError):
            await store.get("k")  # the first endpoint refuses; the next call moves on
        assert await store.get("k") == Versioned(None, 0)
    finally:
        await store.close()



# -- settings and endpoints (no server) ----------------------------------------------------


@pytest.mark.parametrize("field", ["op_timeout_s", "poll_interval_s", "reconnect_backoff_max_s"])
@pytest.mark.parametrize("bad", [0, -1.0, float("inf")])
def test_settings_reject_bad_values(field, bad):
    with pytest.raises(ValueError, match=field):
        EtcdStoreSettings(**{field: bad}).validate()


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:2379", ("127.0.0.1", 2379)),
    ("http://etcd-0.etcd:2379", ("etcd-0.etcd", 2379)),
    ("https://etcd-0.etcd:2379", ("etcd-0.etcd", 2379)),
    ("[::1]:2379", ("[::1]", 2379)),
])
def test_parse_endpoint(text, expected):
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize("text", ["ftp://x:2379", "localhost", "http://:2379"])
def test_parse_endpoint_rejects(text):
    with pytest.raises(ValueError):
        parse_endpoint(text)


async def test_constructor_starts_nothing():
    tasks = asyncio.all_tasks()
    store = EtcdStore(["127.0.0.1:1"], "/p")
    assert asyncio.all_tasks() == tasks and store._clients == [None]
    await store.close()

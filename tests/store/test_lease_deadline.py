"""A leader's lease ends on its own clock: however long a refresh call to etcd hangs (a silent
network, a stalled etcd), the leader lets go by its deadline (the time its last successful
refresh was sent plus the TTL). etcd expires the lease no earlier, so the next leader is
elected only after this one stepped down: no two leaders act at once (the chaos run's network
test found a 0.18 s overlap when a refresh outlived the lease)."""

from __future__ import annotations

import asyncio

import pytest

from controller.etcd_store import EtcdStore, EtcdStoreSettings
from tests.etcd_server import EtcdServer

#: each etcd call may take this long: far past the lease, as a call into a silent network does
SLOW_CALLS = EtcdStoreSettings(op_timeout_s=60.0, poll_interval_s=0.05, reconnect_backoff_max_s=0.2)
WAIT_S = 20.0  # well under SLOW_CALLS.op_timeout_s: only the deadline can end the leadership in time


@pytest.mark.etcd
async def test_a_refresh_that_hangs_past_the_deadline_still_ends_the_leadership_by_it():
    etcd = EtcdServer.start_new()
    store = EtcdStore([etcd.endpoint], "/fthsdp-test/deadline", SLOW_CALLS)
    try:
        lead = await asyncio.wait_for(store.campaign("a", ttl_s=1), WAIT_S)
        etcd.pause()  # every refresh from now on hangs until op_timeout_s
        await asyncio.wait_for(lead.lost.wait(), WAIT_S)
        assert await store.cas("k", b"late", 0, lead) is None  # fenced: a lost leadership writes nothing
    finally:
        etcd.resume()
        await store.close()
        etcd.close()

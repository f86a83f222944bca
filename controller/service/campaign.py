"""The controller's own leadership: campaigning in the store, leading, stepping down.

"Leader" in controller/ means this: the one controller of a job that holds the store's
leadership lease (the others are standbys). A replica's rank 0 is its *coordinator*.

    standby --(wins the campaign, loads the durable state)--> leader
    leader  --(lease lost, or deposed: a write was refused)--> standby (campaigns again)
    leader  --(the store keeps refusing writes: abdicates)--> standby, out of the next
              election for a lease TTL so another candidate can win

`Campaign` runs the loop; the server (controller/service/server.py) keeps what a request
reads: `leading`, `leadership`, `leader_address`, and fails its waiters on stepping down.
"""

from __future__ import annotations

import asyncio
import json
import logging

from controller.core.commands import Takeover
from controller.store import Leadership, StoreError

log = logging.getLogger("fthsdp.controller")

#: How often a standby re-reads where the leader is.
LEADER_WATCH_S = 0.5
#: How long a failed campaign waits before it tries again.
RETRY_S = 0.5


class Campaign:
    def __init__(self, server) -> None:
        self.server = server
        #: why this controller steps down of its own accord (None: it does not)
        self._abdication: str | None = None

    async def run(self) -> None:
        """Campaign, lead until the leadership is lost, step down; again, for ever."""
        srv = self.server
        while True:
            leadership = None
            try:
                leadership = await srv.store.campaign(srv.candidate, srv.settings.lease_ttl_s)
                core = await srv.load_core(for_writing=True)
            except StoreError as exc:
                log.warning("store unavailable while campaigning: %s; retrying", exc)
                if leadership is not None:  # won but could not load: let go, or nobody ever leads
                    await self.let_go(leadership)
                await asyncio.sleep(RETRY_S)
                continue
            except Exception:  # noqa: BLE001 - a standby that silently stops campaigning is worse
                log.exception("campaign failed unexpectedly; retrying")
                if leadership is not None:
                    await self.let_go(leadership)
                await asyncio.sleep(RETRY_S)
                continue
            srv.core, srv.leadership, srv.leading = core, leadership, True
            srv.leader_address = srv.advertise_address
            await self._announce(leadership)
            # Clients lost the old leader and back off: they get a reconnect cycle to find us
            # before silence counts.
            srv.submit(Takeover(srv.candidate, srv.settings.takeover_grace_s))
            srv.set_health(True)
            log.info("controller %s became leader (quorum id %s)", srv.candidate,
                     core.view.quorum.quorum_id if core.view.quorum else 0)
            ticker = asyncio.create_task(srv.tick(), name="ticker")
            try:
                await leadership.lost.wait()
            finally:
                ticker.cancel()
            abdication, self._abdication = self._abdication, None
            srv.step_down(abdication or "leadership lost")
            if abdication:
                await self._release(leadership)

    async def _release(self, leadership: Leadership) -> None:
        """After stepping down for failed writes: give the lease back so a standby can win at
        once, then keep out of the next election for a lease TTL to let it."""
        await self.let_go(leadership)
        self.server.leadership = None
        await asyncio.sleep(self.server.settings.lease_ttl_s)

    def abdicate(self, why: str) -> None:
        """Step down because the store keeps refusing writes (see WriteStreak)."""
        srv = self.server
        if self._abdication is None and srv.leadership is not None:
            self._abdication = why
            log.error("controller %s steps down: %s", srv.candidate, why)
            srv.step_down(why)
            srv.leadership.lost.set()

    def deposed(self, why: str) -> None:
        """Another controller leads: a write was refused."""
        self.server.leadership.lost.set()
        self.server.step_down(why)

    async def let_go(self, leadership: Leadership) -> None:
        try:
            await asyncio.wait_for(self.server.store.resign(leadership), self.server.settings.stop_grace_s)
        except (StoreError, asyncio.TimeoutError, OSError):
            log.warning("could not resign a leadership it could not use; the lease will expire")

    async def _announce(self, leadership: Leadership) -> None:
        """Write where clients reach the new leader, so standbys can point them there. Best
        effort: without it standbys only say "not leader"; a refused write means we lost."""
        srv = self.server
        key = srv.key("leader")
        record = json.dumps({"candidate": srv.candidate, "address": srv.advertise_address}).encode()
        try:
            revision = (await srv.store.get(key)).revision
            if await srv.store.cas(key, record, revision, leadership) is None:
                leadership.lost.set()
        except StoreError as exc:
            log.warning("could not record this leader's address: %s", exc)

    async def watch_leader(self) -> None:
        """While a standby, keep the leader's address fresh (the record is trusted only while
        its candidate holds the lease). Best effort: a failure only leaves it unknown."""
        srv = self.server
        while True:
            if not srv.leading:
                try:
                    found = await srv.store.get(srv.key("leader"))
                    record = json.loads(found.value) if found.value else {}
                    current = await srv.store.leader()
                    srv.leader_address = record.get("address", "") if current and current == record.get(
                        "candidate") else ""
                except (StoreError, ValueError, OSError) as exc:
                    log.debug("could not read the leader's address: %s", exc)
                    srv.leader_address = ""
            await asyncio.sleep(LEADER_WATCH_S)

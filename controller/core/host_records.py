"""How hosts are stored: their shard, their durable record, each shard's bytes. Pure.

Hosts are persisted in HOST_SHARDS shards, so one change rewrites 1/HOST_SHARDS of them, and
each shard stays well below one store write (controller.core.sizes). `HostShards` keeps which
hosts each shard holds, each host's encoded record until it changes, and the bytes each shard
may grow to; the host registry (controller.core.hosts) tells it what changed.
"""

from __future__ import annotations

import zlib
from dataclasses import fields

from controller.core.model import Host
from controller.core.sizes import ShardBudget, encode_section, host_reservation_bytes

HOSTS_SNAPSHOT_VERSION = 1
HOST_SHARDS = 64
#: What of a host survives a failover (last_seen starts anew; the assignment is written apart;
#: the restart times stay, so a crash loop does not get a new restart budget from a failover).
HOST_DURABLE_FIELDS = tuple(f.name for f in fields(Host)
                            if f.name not in ("last_seen", "assignment", "finishing_trainers"))


def host_shard(host_id: str) -> int:
    return zlib.crc32(host_id.encode()) % HOST_SHARDS


def host_record(h: Host) -> dict:
    """A host as its snapshot shard holds it."""
    return {**{k: getattr(h, k) for k in HOST_DURABLE_FIELDS},
            "assignment": [h.assignment.replica_id, list(h.assignment.ranks), h.assignment.world_size]
            if h.assignment else None}


class HostShards:
    def __init__(self) -> None:
        #: bytes each host shard may grow to (see controller.core.sizes)
        self.budget = ShardBudget()
        #: host ids by shard
        self.members: dict[int, dict[str, None]] = {}
        #: each host's encoded record, until it changes (`changed`)
        self._encoded: dict[str, bytes] = {}

    def add(self, host_id: str) -> None:
        self.members.setdefault(host_shard(host_id), {})[host_id] = None

    def changed(self, host_id: str) -> None:
        self._encoded.pop(host_id, None)

    def problem(self, h: Host, settings) -> str | None:
        """Why `h`'s record could push its shard past a store write (None: it fits)."""
        return self.budget.problem(h.host_id, host_shard(h.host_id), self.reservation(h, settings), settings)

    def reserve(self, h: Host, settings) -> None:
        self.budget.reserve(h.host_id, host_shard(h.host_id), self.reservation(h, settings))

    @staticmethod
    def reservation(h: Host, settings) -> int:
        return host_reservation_bytes(host_record(h), h.slots, settings)

    def encoded(self, shard: int, hosts: dict[str, Host]) -> bytes:
        """A host shard's bytes in the store, as encode_section of its snapshot would make
        them, re-encoding only the hosts changed since the last time: an urgent write per
        registration stays cheap at 12K hosts."""
        records = []
        for host_id in self.members.get(shard, ()):
            record = self._encoded.get(host_id)
            if record is None:
                record = self._encoded[host_id] = encode_section(host_record(hosts[host_id]))
            records.append(record)
        return b'{"version":%d,"hosts":[%s]}' % (HOSTS_SNAPSHOT_VERSION, b",".join(records))

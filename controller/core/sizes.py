"""How big each durable section can get, checked before a request is acknowledged. Pure.

The store refuses a write larger than its request limit (etcd: --max-request-bytes, 1.5 MiB by
default, `ControllerSettings.store_max_request_bytes`). A refused write must never be the first
sign of trouble, so every section is kept below the limit up front:

- `replicas` (replica records and the current quorum): bounded by the number of replica
  records and the length of every field, so its worst case follows from the settings, and
  `ControllerSettings.validate()` refuses settings under which it could outgrow the limit;
- `addresses/{replica}`: its exact size is computed from the request (`addresses_problem`)
  and a Quorum request that would not fit is refused before anything changes;
- `hosts/{shard}`: each host reserves the most its record can grow to (its labels as sent, the
  longest cordon reason, an assignment as large as its slots); a registration that would push
  its shard past the limit is refused (`ShardBudget`);
- `journal` (recent quorums and events, for the status API): written behind and only for
  display, so the oldest entries are left out of the durable copy until it fits
  (`fit_journal`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import fields

from controller.core.checks import JSON_BYTES_PER_CHAR, MAX_CORDON_REASON_CHARS
from controller.core.model import Replica

#: What a write carries besides its value: the key, the fencing compares on the election key,
#: the read-back and gRPC framing. Generous: keys are short.
STORE_REQUEST_OVERHEAD_BYTES = 4096
#: The longest float as JSON writes it, e.g. -1.2345678901234567e-308.
_FLOAT_CHARS = 24
#: Characters of one rank in an assignment's rank list ("1048575,").
_RANK_CHARS = 8


def encode_section(snapshot: dict) -> bytes:
    """A section's bytes in the store (the one encoding, shared by the writer and the checks)."""
    return json.dumps(snapshot, separators=(",", ":")).encode()


def value_limit(settings) -> int:
    """The largest value a section may have."""
    return settings.store_max_request_bytes - STORE_REQUEST_OVERHEAD_BYTES


def addresses_problem(replica_id: str, snapshot: dict, settings) -> str | None:
    """Why a replica's addresses cannot be stored, or None when they fit."""
    size, limit = len(encode_section(snapshot)), value_limit(settings)
    if size <= limit:
        return None
    return (f"the addresses of replica {replica_id} take {size} bytes in the store, more than the "
            f"{limit} a write may hold (store_max_request_bytes={settings.store_max_request_bytes}); "
            f"send shorter addresses")


def worst_replica_record_bytes(settings) -> int:
    """The longest a replica's durable record can be: every text at its bound, every number
    at its longest. Fields are read from `Replica`, so new ones are counted (text fields other
    than the known ones at max_id_chars)."""
    texts = {"reason": settings.max_reason_chars * JSON_BYTES_PER_CHAR,
             "coordinator_address": settings.max_address_chars}
    size = 2  # {}
    for f in fields(Replica):
        if f.name in ("last_seen", "ftar_addresses", "state_addresses", "given_restored"):
            continue  # not durable
        size += len(f.name) + 4  # "name": and a comma
        kind = str(f.type)
        if "str" in kind:
            size += texts.get(f.name, settings.max_id_chars) + 2
        else:
            size += _FLOAT_CHARS
    # its goodput entry (GoodputTracker.snapshot): "id": [covered, commits, failures, down_since, abandoned]
    return size + settings.max_id_chars + 8 + 5 * (_FLOAT_CHARS + 1)


def worst_quorum_bytes(settings) -> int:
    n = settings.max_replica_records
    member = settings.max_id_chars + _FLOAT_CHARS + 60
    # recover: every behind replica lists every healthy one; worst with half behind.
    recover = (n // 2) * (settings.max_id_chars + 6) * (n - n // 2 + 1)
    return 200 + n * member + recover + settings.max_reason_chars * JSON_BYTES_PER_CHAR + 3 * _FLOAT_CHARS


@functools.lru_cache(maxsize=8)
def digest_ledger_budget(settings) -> int:
    """What the replicas section can give the pending digest comparisons (DigestLedger.snapshot)
    beyond the worst case of everything else in it: they are written newest step first, as
    many as fit (0: none)."""
    n = settings.max_replica_records
    return max(value_limit(settings) - n * worst_replica_record_bytes(settings) - worst_quorum_bytes(settings)
               - 2048, 0)


def replicas_section_problem(settings) -> str | None:
    """Why these settings could let the replicas section outgrow the store, or None."""
    n = settings.max_replica_records
    worst = n * worst_replica_record_bytes(settings) + worst_quorum_bytes(settings) + 1024
    worst += settings.max_reason_chars * JSON_BYTES_PER_CHAR  # the job's end reason
    limit = value_limit(settings)
    if worst <= limit:
        return None
    return (f"With replicas={settings.replicas} (up to {n} replica records), max_id_chars="
            f"{settings.max_id_chars} and max_reason_chars={settings.max_reason_chars} the replicas "
            f"section could reach {worst} bytes, more than a store write may hold ({limit} of "
            f"store_max_request_bytes={settings.store_max_request_bytes}); lower max_id_chars or "
            f"max_reason_chars, or raise store_max_request_bytes (etcd --max-request-bytes).")


def host_reservation_bytes(record: dict, slots: int, settings) -> int:
    """The most a host's durable record can grow to: as it is, plus the longest cordon
    reason, an assignment with as many ranks as its slots (or its own, if more) and
    restart_budget restart times. `record` holds the durable fields as the snapshot writes them."""
    base = len(encode_section({**record, "cordon_reason": "", "assignment": None, "restart_times_s": []}))
    assignment = record.get("assignment")
    ranks = max(slots, len(assignment[1]) if assignment else 0, 1)
    return (base + MAX_CORDON_REASON_CHARS * JSON_BYTES_PER_CHAR  # the longest cordon reason
            + settings.max_id_chars + 2 * _FLOAT_CHARS + ranks * _RANK_CHARS  # the largest assignment
            + settings.restart_budget * _FLOAT_CHARS)  # a full budget of restart times


class ShardBudget:
    """Reserved bytes per host shard: a registration is admitted only if its shard, with
    every host's worst case reserved, still fits in one store write."""

    def __init__(self) -> None:
        self.reserved: dict[int, int] = {}
        self.by_host: dict[str, int] = {}

    def problem(self, host_id: str, shard: int, reservation: int, settings) -> str | None:
        total = self.reserved.get(shard, 0) - self.by_host.get(host_id, 0) + reservation
        limit = value_limit(settings)
        if total <= limit:
            return None
        return (f"host {host_id} cannot be stored: its shard ({shard}) would need up to {total} bytes, "
                f"more than the {limit} a store write may hold (store_max_request_bytes="
                f"{settings.store_max_request_bytes}); use fewer or shorter labels, or raise the limit")

    def reserve(self, host_id: str, shard: int, reservation: int) -> None:
        self.reserved[shard] = self.reserved.get(shard, 0) - self.by_host.get(host_id, 0) + reservation
        self.by_host[host_id] = reservation


def fit_journal(snapshot: dict, limit: int) -> tuple[dict, int]:
    """The journal with its oldest quorums and events left out until it fits in `limit`
    bytes; returns it and how many entries were left out (0 when it fitted)."""
    if len(encode_section(snapshot)) <= limit:
        return snapshot, 0
    budget = limit - len(encode_section({**snapshot, "history": [], "events": []}))
    kept: dict[str, list] = {}
    for name, share in (("history", budget // 2), ("events", None)):
        entries, keep, used = snapshot[name], 0, 0
        allowed = share if share is not None else budget
        for entry in reversed(entries):
            size = len(encode_section(entry)) + 1
            if used + size > allowed:
                break
            used, keep = used + size, keep + 1
        kept[name] = entries[len(entries) - keep:]
        budget -= used
    dropped = len(snapshot["history"]) - len(kept["history"]) + len(snapshot["events"]) - len(kept["events"])
    return {**snapshot, **kept}, dropped

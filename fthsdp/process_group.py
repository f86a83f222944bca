"""The replica's own process group (its ranks, for FSDP2): each restart meets only its own ranks.

Under torchrun: torchrun's agent keeps one TCPStore across the restarts of its workers
(MASTER_PORT, with TORCHELASTIC_USE_AGENT_STORE=True), and torch's env:// rendezvous reads it
without a per-attempt prefix: a restarted rank finds the addresses the previous attempt's ranks
published and Gloo's full mesh dials those dead ports ("connectFullMesh failed ... Connection
refused") until a later restart happens to publish first. So the group opens on that store
under a prefix of the attempt (TORCHELASTIC_RESTART_COUNT).

Under an agent (FTHSDP_REPLICA_VERSION set; race 2 of issue 28): the rendezvous is the rank-0
host's fixed MASTER_ADDR:MASTER_PORT, and when a host is lost the spare's ASSIGN and the
survivors' RESTART go out together. The spare's warm standby dials the rank-0 host at once,
while the old rank 0 there is still stopping: with env:// it read the old group's addresses
from the old rank 0's store and formed a group with a process that was going away (its first
collective timed out), or was reset when that rank exited. So here rank 0 serves the store,
writes its replica version (`RANK0_VERSION_KEY`), meets under that version's prefix and marks
the group formed (`FORMED_KEY`) once it is. Every other rank dials the store and waits, at
most `PROBE_S` a dial, for rank 0's version, and joins it unless `stale_store` says the store
is not its own: a group of another version that already formed (the old rank 0's, stopping),
or a newer rank 0 than this rank (this rank is the stale one). Such a store, or one that goes
away (a reset), is dialled again until the group's timeout; then RendezvousTimeout names the
address, the version and the last error. Rank 0 likewise retries a port still held by the old
rank 0 on its host. Without a version (plain env) it is env:// as usual.

Why not one prefix per version: the hosts of a replica share a version after every restart or
swap (the controller restarts them under one), but not in the first layout, where each host's
assignment got its own version as it registered (rank 0's first). So a rank of a newer version
joins an older rank 0 whose group has not formed. What this leaves open: an old rank 0 whose
group never formed (its peer died before joining) and that is still stopping when the new rank
dials it; the new rank then meets a process that goes away, fails, and its replica restarts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Callable, TypeVar

import torch.distributed as dist

from fthsdp.settings import ENV_REPLICA_VERSION

log = logging.getLogger(__name__)
T = TypeVar("T")

REPLICA_VERSION = ENV_REPLICA_VERSION  # set by the agent (agent.env)
#: rank 0's replica version, in its store
RANK0_VERSION_KEY = "fthsdp/rank0_version"
#: under the version's prefix: rank 0's group formed (a rank of another version arrives late)
FORMED_KEY = "formed"
#: the longest one dial waits for a store to answer and show rank 0's version
PROBE_S = 2.0
#: between two attempts that failed at once (a port still bound, a reset)
RETRY_PAUSE_S = 0.1


class RendezvousTimeout(TimeoutError):
    """The replica's ranks did not meet within the group's timeout."""


def prefix(version: int) -> str:
    return f"fthsdp/replica_v{version}"


def init_replica_group(backend: str, rank: int, world_size: int, timeout: timedelta) -> int:
    """dist.init_process_group for this replica's ranks (MASTER_ADDR, MASTER_PORT from the env).

    Returns the replica version the group met under (its rank 0's; 0 without a version), and
    sets it as FTHSDP_REPLICA_VERSION: a rank of the first layout that was given a newer one
    than its rank 0 belongs to rank 0's restart, and its hello must say so (the coordinator
    refuses a hello of another version; fthsdp/step/incarnations.py). A caller that read its
    RuntimeSettings before passes it on: `replace(settings, replica_version=...)`."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                              is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=dist.PrefixStore(f"fthsdp/attempt_{attempt}", store), rank=rank,
                                world_size=world_size, timeout=timeout)
        return 0
    raw = os.environ.get(REPLICA_VERSION, "0") or "0"
    try:
        version = int(raw)
    except ValueError:
        raise ValueError(f"{REPLICA_VERSION} must be an integer, got {raw!r}") from None
    if version <= 0:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
        return 0
    store, rank0_version = meet(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world_size,
                                version, timeout.total_seconds())
    dist.init_process_group(backend, store=dist.PrefixStore(prefix(rank0_version), store), rank=rank,
                            world_size=world_size, timeout=timeout)
    if rank == 0:
        store.set(f"{prefix(version)}/{FORMED_KEY}", "1")
    os.environ[REPLICA_VERSION] = str(rank0_version)
    return rank0_version


def stale_store(own_version: int, rank0_version: int, formed: bool) -> str | None:
    """Why a rank of `own_version` must not join the store of a rank 0 of `rank0_version`
    (whose group has `formed` or not), or None when it may. Pure."""
    if rank0_version == own_version:
        return None
    if formed:
        return (f"its rank 0 is of replica version {rank0_version}, whose group formed already: "
                f"a rank 0 that is stopping (this rank is of version {own_version})")
    if rank0_version > own_version:
        return (f"its rank 0 is of replica version {rank0_version}, newer than this rank's {own_version}: "
                f"this rank is of a restart that is over")
    return None  # a first layout: rank 0's host was given its version before this one


class StaleStore(RuntimeError):
    """The store reached is another restart's (retried, as a reset is)."""


def meet(host: str, port: int, rank: int, world_size: int, version: int,
         timeout_s: float) -> tuple[dist.Store, int]:
    """The replica's store at host:port and its rank 0's version, within `timeout_s`: served
    (rank 0, its version written) or reached and judged by `stale_store` (the others)."""
    where = f"{host}:{port}"
    if rank == 0:
        def serve(remaining_s: float) -> tuple[dist.Store, int]:
            store = dist.TCPStore(host, port, world_size, is_master=True, wait_for_workers=False,
                                  timeout=timedelta(seconds=max(remaining_s, 1.0)))
            store.set(RANK0_VERSION_KEY, str(version))
            return store, version
        return retry_until(serve, timeout_s, f"rank 0 of replica version {version} serving its store at {where}")

    def reach(remaining_s: float) -> tuple[dist.Store, int]:
        probe = timedelta(seconds=max(min(PROBE_S, remaining_s), 0.1))
        listening(host, port, probe.total_seconds())
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=probe)
        store.wait([RANK0_VERSION_KEY], probe)  # a store without it is not a versioned rank 0's (yet)
        rank0_version = int(store.get(RANK0_VERSION_KEY))
        why = stale_store(version, rank0_version, store.check([f"{prefix(rank0_version)}/{FORMED_KEY}"]))
        if why:
            raise StaleStore(f"the store at {where} is not this rank's: {why}")
        store.set_timeout(timedelta(seconds=max(remaining_s, 1.0)))
        return store, rank0_version
    return retry_until(reach, timeout_s, f"rank {rank} of replica version {version} reaching its rank 0's "
                                         f"store at {where}")


def listening(host: str, port: int, timeout_s: float) -> None:
    """Something accepts connections at host:port, or a RuntimeError (retried) says it does
    not: a dial before rank 0 listens fails here, quietly, not in TCPStore's logged retries."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise RuntimeError(f"nothing accepts connections at {host}:{port} yet ({e})") from None


def retry_until(attempt: Callable[[float], T], timeout_s: float, what: str, *,
                clock: Callable[[], float] = time.monotonic,
                pause: Callable[[float], object] = threading.Event().wait) -> T:
    """attempt(remaining_s) until it returns; a RuntimeError (torch's DistError: refused,
    reset, timed out) is tried again, after RETRY_PAUSE_S, until `timeout_s` from now; then
    RendezvousTimeout names `what` and the last error. Each new kind of error is logged once."""
    deadline = clock() + timeout_s
    tries, last = 0, ""
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            raise RendezvousTimeout(f"timed out after {timeout_s:g} s ({tries} tries) {what}; last error: {last}")
        tries += 1
        try:
            return attempt(remaining)
        except RuntimeError as e:
            error = " ".join(str(e).split())[:300]
            if error.split(" after ")[0] != last.split(" after ")[0]:
                log.info("%s: try %d failed, redials: %s", what, tries, error)
            last = error
        pause(min(RETRY_PAUSE_S, max(deadline - clock(), 0.0)))

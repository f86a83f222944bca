"""The wiring of one trainer process's parts: what `Manager.start()` opens, in order.

    parts = open_parts(settings, seams, incarnation, process_group, snapshot)   # or raises, nothing left open
    ...
    parts.close()

The FTAR endpoint (cross-replica all-reduce), the gradient reducer on top of it, the state
server (catch-up source), on rank 0 the replica's coordinator with its controller client, and
the rank's channel to that coordinator, connected with this rank's hello. Each part passes
through its `Seams` wrapper (identity by default): tests inject faults by wrapping a real part
from outside (tests/runtime/faults.py); no production code checks for faults. The Manager
(fthsdp/manager.py) only executes the step protocol's effects on these parts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch.distributed as dist

from ftar_kernels import FtarEndpoint, FtarSettings
from fthsdp.settings import RuntimeSettings
from fthsdp.state.checkpoint import CheckpointStore
from fthsdp.state.serve import Snapshot, StateServer
from fthsdp.step import messages as msg
from fthsdp.step.client import CoordinatorClient
from fthsdp.step.controller_client import ControllerClient
from fthsdp.step.coordinator import CoordinatorService
from fthsdp.sync.gradients import GradientSync
from fthsdp.telemetry import Collectives, Telemetry
from protos import job_secret

log = logging.getLogger(__name__)
T = TypeVar("T")


def _same(part: T) -> T:
    return part


@dataclass(frozen=True)
class Seams:
    """Wrappers around the parts `open_parts` builds, identity by default. Tests inject faults
    by wrapping a real part from outside (tests/runtime/faults.py); no production code
    checks for faults."""
    endpoint: Callable[[FtarEndpoint], FtarEndpoint] = _same
    sync: Callable[[GradientSync], GradientSync] = _same
    state_server: Callable[[StateServer], StateServer] = _same
    channel: Callable[[CoordinatorClient], CoordinatorClient] = _same
    controller: Callable[[ControllerClient], ControllerClient] = _same
    checkpoints: Callable[[CheckpointStore], CheckpointStore] = _same


@dataclass
class Parts:
    """One rank's open parts (`coordinator` on rank 0 only)."""
    endpoint: FtarEndpoint
    collectives: Collectives
    sync: GradientSync
    state_server: StateServer
    coordinator: CoordinatorService | None
    client: CoordinatorClient

    def close(self) -> None:
        close_all(self.client, self.coordinator, self.state_server, self.endpoint)
        if self.collectives.telemetry is not None:
            self.collectives.telemetry.close()


def open_parts(s: RuntimeSettings, seams: Seams, incarnation: str, process_group: dist.ProcessGroup | None,
               snapshot: Callable[[], Snapshot]) -> Parts:
    """Open every part and connect to the coordinator (rank 0 starts it first). On any error the
    parts opened so far are closed and the error is raised (a ChannelError: the coordinator could
    not be reached)."""
    opened: list = []
    collectives = Collectives(None, s.world_size)
    try:
        ftar_key = s.port_key(job_secret.PURPOSE_FTAR)
        endpoint = seams.endpoint(FtarEndpoint.open(s.bind_host, 0, FtarSettings(
            chunk_bytes=s.ftar_chunk_bytes, chunks_in_flight=s.ftar_chunks_in_flight,
            timeout_s=s.allreduce_timeout_s, connect_timeout_s=min(10.0, s.allreduce_timeout_s),
            auth_key=ftar_key or b"", allow_unauthenticated=ftar_key is None)))
        opened.append(endpoint)
        collectives = Collectives(Telemetry.from_env(s.replica_id, s.rank, time.monotonic()), s.world_size)
        sync = seams.sync(GradientSync(endpoint, s.rank, s.world_size, s.allreduce_timeout_s, process_group,
                                       collectives))
        state_server = seams.state_server(
            StateServer(s.bind_host, 0, snapshot, f"{s.replica_id}/{s.rank}",
                        key=s.port_key(job_secret.PURPOSE_STATE), hello_timeout_s=s.hello_timeout_s).start())
        opened.append(state_server)
        coordinator, address = _start_coordinator(s, seams, incarnation) if s.rank == 0 else (None, s.coordinator_address)
        if coordinator is not None:
            opened.append(coordinator)
        hello = msg.hello(s.rank, s.world_size, s.job_id, s.replica_id, endpoint.address, state_server.address,
                          incarnation, s.replica_version)
        client = seams.channel(CoordinatorClient.for_rank(s, address, incarnation)).connect(
            s.quorum_timeout_s, hello, s.port_key(job_secret.PURPOSE_COORDINATOR))
    except BaseException:
        close_all(*reversed(opened))
        if collectives.telemetry is not None:
            collectives.telemetry.close()
        raise
    return Parts(endpoint, collectives, sync, state_server, coordinator, client)


def _start_coordinator(s: RuntimeSettings, seams: Seams, incarnation: str) -> tuple[CoordinatorService, str]:
    """Rank 0 hosts the replica's coordinator; rank 0 is then its client like every other rank."""
    controller = seams.controller(ControllerClient(
        s.controller_address, s.job_id, s.replica_id, incarnation, job_secret=s.job_secret,
        connect_timeout_s=s.connect_timeout_s, reconnect_timeout_s=s.reconnect_timeout_s,
        checkpoint_every_steps=s.checkpoint_every_steps if s.checkpoint_dir else 0))
    address = s.coordinator_address
    host, _, port = address.rpartition(":") if address else (s.bind_host, "", "0")
    coordinator = CoordinatorService(s, controller, host, int(port)).start()
    controller.start_heartbeats(s.heartbeat_interval_s)
    return coordinator, coordinator.address


def close_all(*parts) -> None:
    """Close each part that exists (best effort: one that fails to close does not stop the rest)."""
    for part in parts:
        if part is not None:
            try:
                part.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.debug("closing %s failed: %r", type(part).__name__, exc)

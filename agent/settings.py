"""Agent settings: one frozen dataclass, units in names, one validate().

Command-line flags fill these (see `agent.main`, which also reads the TLS and job-secret
variables, flags winning); nothing here reads the environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.policy import ON_JOB_COMPLETE
from protos.dial import CONNECT_TIMEOUT_S, RECONNECT_TIMEOUT_S, TlsFiles
from protos.job_secret import JobSecret
from protos import timeout_rules
from protos.telemetry_ring import MAX_WINDOW_COLLECTIVES

# Placeholders substituted in the command template. Only these exact `{name}` tokens are
# replaced; any other braces (a dict literal in `python -c ...`) are left alone.
PLACEHOLDERS = ("replica_id", "rank", "world_size", "host_id", "job_id", "slot")
ASSIGNMENT_PLACEHOLDERS = ("replica_id", "rank", "world_size")
_PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def substitute(template: tuple[str, ...], values: dict[str, object]) -> list[str]:
    """The command for one trainer: each known `{name}` replaced by `values[name]`."""
    return [_PLACEHOLDER_RE.sub(lambda m: str(values[m.group(1)]), arg) for arg in template]


def placeholders_in(template: tuple[str, ...]) -> set[str]:
    return {m.group(1) for arg in template for m in _PLACEHOLDER_RE.finditer(arg)}


@dataclass(frozen=True)
class AgentSettings:
    # Controller gRPC addresses in HA order; on failure the agent tries the next.
    controller_addresses: tuple[str, ...]
    # This host's id (unique in the job).
    host_id: str
    # The trainer command; placeholders are listed in PLACEHOLDERS.
    command: tuple[str, ...]
    # Registered as a spare (the controller moves failed hosts' work here). Without it and
    # without replica_id the host is available: the controller gives it a slot of its own
    # replica layout (hosts_per_replica), or puts it in the spare pool when it has none free.
    spare: bool = False
    # Trainer processes this host can run (GPUs); 0 means "as many as --ranks, at least 1".
    slots: int = 0
    # Free-form labels; `zone` decides which spare replaces which host.
    labels: dict[str, str] = field(default_factory=dict)
    # Active host assignment.
    replica_id: str = ""
    ranks: tuple[int, ...] = ()
    world_size: int = 0
    # Trainers get it as FTHSDP_JOB_ID; empty means "whatever job the controller runs"
    # (the controller accepts an empty job_id).
    job_id: str = ""
    # A standby trainer that dies is restarted here, at most restart_budget times per
    # restart_window_s per slot. (A trainer with an assignment is never restarted alone: the
    # controller restarts its whole replica and keeps that budget.)
    restart_budget: int = 3
    restart_window_s: float = 300.0
    # Pre-start standby trainers while the host has no assignment.
    standby: bool = False
    # Warm restarts: next to each running trainer keep one pre-started standby (a reserve,
    # imports done) that takes the slot's work when its trainer must be replaced (a restart,
    # a new placement); a new reserve is then started in the background. Costs one idle
    # process (and its memory) per slot. The reserve starts reserve_delay_s after its trainer
    # (its imports compete with the trainer's start for CPU); a failure before that is cold.
    warm_restarts: bool = False
    reserve_delay_s: float = 5.0
    heartbeat_interval_s: float = 1.0
    # Stop = SIGTERM to the process group, SIGKILL after this grace.
    stop_grace_s: float = 5.0
    # Once the job COMPLETED, a trainer still running is finishing its own work after
    # Manager.close() (export, evaluation, upload): it may exit on its own for this long, then it
    # is stopped (stop_grace_s). Kubernetes' terminationGracePeriodSeconds should cover it.
    finish_grace_s: float = 600.0
    # Lines of a trainer's stderr kept and sent with its exit report.
    stderr_tail_lines: int = 20
    # Reconnect (protos.dial.AddressRotation): every address once at once, then pauses of
    # base_s * 2**failed_passes, capped at cap_s. The controller assumes its clients' cap
    # (ControllerSettings.client_backoff_cap_s): it must be at least this cap (the rules of
    # protos/timeout_rules.py; `fthsdp timeouts` checks them across processes).
    reconnect_base_s: float = 0.2
    reconnect_cap_s: float = 1.0
    # Unary calls (register, ack, exit report) give up after this and reconnect; a heartbeat
    # stream without an answer for this long counts as a failed controller too (at most
    # ControllerSettings.client_timeout_s; at least 2 heartbeat intervals).
    rpc_timeout_s: float = 5.0
    # The agent gives up (exit status 5, so a DaemonSet restarts it visibly) once no controller
    # address answered for connect_timeout_s from its start (a wrong address, a missing
    # controller: said soon), or for reconnect_timeout_s since its last working session (a
    # failover or a restarted controller takes a while; trainers that still run are kept, and the
    # agent retries, up to twice reconnect_timeout_s: policy.keep_trainers_past_timeout). A second
    # agent started with the host id of a live one is refused (exit 3) once refused for
    # connect_timeout_s.
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    reconnect_timeout_s: float = RECONNECT_TIMEOUT_S
    # The supervisor looks at its processes at least this often (exits wake it at once).
    poll_interval_s: float = 0.5
    # Once the controller says the job is COMPLETED: "exit" (stop trainers gracefully, exit 0)
    # or "idle" (stop trainers, stay registered and start nothing) or "pool" (stop trainers, then
    # serve the next job the controller address answers for: agent.policy.serves_next_job).
    on_job_complete: str = "exit"
    # TLS to the controller (CA file turns it on; cert + key for mTLS). Trainers get the same
    # files through the FTHSDP_TLS_* environment (see protos.dial).
    tls: TlsFiles = field(default_factory=TlsFiles)
    # The job secret every trainer gets (agent.env: FTHSDP_JOB_SECRET); its repr hides it.
    job_secret: JobSecret | None = None
    # With no job secret: let the trainers run their ports without authentication.
    insecure_trainer_ports: bool = False
    # Collective telemetry (agent.telemetry): every this many seconds the agent reads its
    # trainers' rings and sends the controller a summary; 0 turns it off (no ring is asked for).
    telemetry_interval_s: float = 5.0
    # Where trainers' rings live; empty: a fresh directory only this agent's user can open
    # (under /dev/shm when the host has it: memory, no disk writeback).
    telemetry_dir: str = ""
    # Straggler statistics are taken over windows of this many collectives per group; every
    # agent of a job must use the same (the controller ignores windows of another length).
    telemetry_window_collectives: int = 32
    # Where other hosts reach this host's trainers (its pod IP; no port). Needed when replicas
    # span hosts: their ranks meet at the address of their rank-0 host.
    advertise_address: str = ""
    # The ports on advertise_address where a replica's rank 0 listens on this host: the
    # torch.distributed rendezvous (MASTER_PORT) and the replica's coordinator. 0: free ports
    # picked when the agent starts (agent.ports).
    rendezvous_port: int = 0
    coordinator_port: int = 0
    # Keeps the registration's secret here (agent.state_file), so that a restarted agent takes
    # its host over at once; "" keeps nothing.
    state_dir: str = ""

    @property
    def slot_count(self) -> int:
        return self.slots or max(1, len(self.ranks))

    def timeout_values(self) -> dict[str, float]:
        """Every timeout of the agent by field name (telemetry only when on): what
        protos/timeout_rules.py judges."""
        prefix = timeout_rules.AGENT + "."
        values = {n[len(prefix):]: getattr(self, n[len(prefix):]) for n in timeout_rules.WAITS if n.startswith(prefix)}
        if not values["telemetry_interval_s"]:
            del values["telemetry_interval_s"]  # 0: off, nothing to be late
        return values

    def validate(self) -> "AgentSettings":
        """Raise ValueError naming the first bad value; return self when all are good."""
        if not self.controller_addresses or not all(self.controller_addresses):
            raise ValueError(f"At least one controller address is needed, got "
                             f"{list(self.controller_addresses)!r}.")
        if not self.host_id:
            raise ValueError("The host id must not be empty.")
        if not self.command:
            raise ValueError("A trainer command template is needed after `--`.")
        if self.slots < 0:
            raise ValueError(f"slots must be >= 0, got {self.slots}.")
        if self.spare and self.replica_id:
            raise ValueError(f"A spare host has no replica, but replica_id={self.replica_id!r} "
                             "was given.")
        if self.replica_id:
            if not self.ranks:
                raise ValueError(f"Replica {self.replica_id!r} needs at least one rank.")
            if self.world_size < 1:
                raise ValueError(f"world_size must be >= 1, got {self.world_size}.")
            bad = [r for r in self.ranks if not 0 <= r < self.world_size]
            if bad:
                raise ValueError(f"Ranks {bad} are outside 0..{self.world_size - 1} "
                                 f"(world_size={self.world_size}).")
            if len(set(self.ranks)) != len(self.ranks):
                raise ValueError(f"Ranks must be distinct, got {list(self.ranks)}.")
            if len(self.ranks) > self.slot_count:
                raise ValueError(f"{len(self.ranks)} ranks do not fit in {self.slot_count} "
                                 "slots.")
        if self.restart_budget < 0:
            raise ValueError(f"restart_budget must be >= 0, got {self.restart_budget}.")
        for name in ("restart_window_s", "heartbeat_interval_s", "reconnect_base_s",
                     "reconnect_cap_s", "rpc_timeout_s", "poll_interval_s", "connect_timeout_s",
                     "reconnect_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}.")
        broken = timeout_rules.problems(timeout_rules.AGENT, self.timeout_values())
        if broken:  # the timeout hierarchy (protos/timeout_rules.py)
            raise ValueError(" ".join(broken))
        if not 0 <= self.reserve_delay_s <= 3600:
            raise ValueError(f"reserve_delay_s must be 0..3600, got {self.reserve_delay_s}.")
        if self.stop_grace_s < 0:
            raise ValueError(f"stop_grace_s must be >= 0, got {self.stop_grace_s}.")
        if not 0 <= self.finish_grace_s <= 86400:
            raise ValueError(f"finish_grace_s must be 0..86400, got {self.finish_grace_s}.")
        if self.stderr_tail_lines < 0:
            raise ValueError(f"stderr_tail_lines must be >= 0, got {self.stderr_tail_lines}.")
        if self.on_job_complete not in ON_JOB_COMPLETE:
            raise ValueError(f"on_job_complete must be one of {', '.join(ON_JOB_COMPLETE)}, got "
                             f"{self.on_job_complete!r}.")
        if self.on_job_complete == "pool" and self.job_id:
            raise ValueError(f"on_job_complete 'pool' serves whichever job its controller address answers for: give "
                             f"no job_id (got {self.job_id!r}).")
        if self.telemetry_interval_s < 0:
            raise ValueError(f"telemetry_interval_s must be >= 0 (0: off), got {self.telemetry_interval_s}.")
        if not 1 <= self.telemetry_window_collectives <= MAX_WINDOW_COLLECTIVES:
            raise ValueError(f"telemetry_window_collectives must be 1..{MAX_WINDOW_COLLECTIVES}, got "
                             f"{self.telemetry_window_collectives}.")
        self.tls.validate()
        if self.job_secret is not None and not isinstance(self.job_secret, JobSecret):
            raise ValueError(f"job_secret must be a protos.job_secret.JobSecret, got a "
                             f"{type(self.job_secret).__name__}.")
        address = self.advertise_address
        if address and (not address.isascii() or not address.isprintable() or any(c in address for c in " /[]")
                        or address.count(":") == 1):
            raise ValueError(f"advertise_address must be a host name or IP address without a port, got "
                             f"{address!r}.")
        for name in ("rendezvous_port", "coordinator_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name} must be 0..65535 (0: pick a free one), got {getattr(self, name)}.")
        if self.rendezvous_port and self.rendezvous_port == self.coordinator_port:
            raise ValueError(f"rendezvous_port and coordinator_port must differ, both are {self.rendezvous_port}.")
        used = placeholders_in(self.command) & set(ASSIGNMENT_PLACEHOLDERS)
        if (self.standby or self.warm_restarts) and used:
            raise ValueError(f"A standby trainer (--standby, --warm-restarts) starts before it has an assignment, so the "
                             f"command template cannot use {sorted(used)}; read the "
                             "FTHSDP_* environment after agent.env.wait_for_assignment().")
        return self

"""Controller settings: one frozen dataclass, units in the names, one validate().

Command-line flags win over the JSON settings file, which wins over these defaults.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from controller.core.diagnosis.settings import DiagnosisSettings
from protos import timeout_rules
from protos import sync_modes

LR_POLICIES = ("none", "linear", "sqrt")
#: Hard ceilings on the settings themselves (a settings file is input too).
MAX_WORLD_SIZE = 1 << 20
MAX_RECENT = 10_000
#: restart_budget's bound: each host's durable record keeps up to that many restart times
MAX_RESTART_BUDGET = 100
MIN_REASON_CHARS, MAX_REASON_CHARS = 64, 65_536
#: Below this not even an empty job's snapshot fits.
MIN_STORE_REQUEST_BYTES = 16_384


@dataclass(frozen=True)
class ControllerSettings:
    job_id: str = "job"
    #: Configured number of replicas: the denominator of lr_scale and the "total" in status.
    replicas: int = 3
    #: A round may close on timeout only once this many replicas have joined.
    min_replicas: int = 1
    #: How long a round waits for missing live replicas, from its first joiner.
    join_timeout_s: float = 5.0
    #: A replica coordinator or agent silent for longer than this is declared dead. At least a
    #: client's reconnect cycle and 3 of its heartbeat intervals (protos/timeout_rules.py).
    heartbeat_timeout_s: float = 10.0
    #: How the learning rate follows the healthy fraction: none | linear | sqrt.
    lr_policy: str = "sqrt"
    #: How replicas meet (protos/sync_modes.py): sync | local_sgd | diloco | streaming_diloco,
    #: the inner steps between two syncs of the same parameters (1 for sync), and the fragments
    #: (streaming_diloco; 1 otherwise). Stated in every quorum answer: trainers must agree.
    sync_mode: str = "sync"
    sync_every_steps: int = 1
    sync_fragments: int = 1
    #: When set, the controller lays replicas out itself: an agent that registers without an
    #: assignment (and not as a spare) gets the first free host slot of replicas r0..r{N-1},
    #: each made of this many hosts of `ranks_per_host` ranks. 0: agents bring assignments.
    hosts_per_replica: int = 0
    ranks_per_host: int = 1
    #: A replica restarts as a unit: when one of its trainers dies, every host of the replica
    #: restarts its ranks together (controller.core.restarts). Each such restart is counted
    #: against the host whose trainer died: at most restart_budget within restart_window_s;
    #: the next death cordons that host and moves its work to a spare instead. The restart times
    #: are part of the host's durable record: a failover does not reset the count. At most
    #: MAX_RESTART_BUDGET.
    restart_budget: int = 3
    restart_window_s: float = 300.0
    #: The job becomes FAILED (final) once no replica could make progress for this long: every
    #: replica DEAD, each waiting on a host that cannot run (dead, or cordoned after a crash
    #: loop spent its restart budget), and no spare free (controller.core.job_failure).
    fail_after_s: float = 300.0
    #: Largest accepted replica world size (ranks per replica).
    max_world_size: int = 65536
    #: Longest accepted identifier (replica, host, job) and address, in characters.
    max_id_chars: int = 128
    max_address_chars: int = 256
    #: Free text from clients (failure reasons, order errors, stderr tails) longer than this is
    #: cut to this many characters, ending with a marker that says how much was cut.
    max_reason_chars: int = 1024
    #: Most hosts (agents) the controller keeps; a registration past it is refused.
    max_hosts: int = 100_000
    #: Most trainer slots, and so ranks, one host may run.
    max_slots_per_host: int = 1024
    #: Largest gRPC request accepted. The biggest legitimate one is a Quorum carrying every
    #: rank's addresses, which must fit in the store anyway (store_max_request_bytes).
    max_request_bytes: int = 8 << 20
    #: The largest write the store accepts: etcd's --max-request-bytes (default 1.5 MiB).
    #: Every write is checked against it before the request that causes it is acknowledged.
    store_max_request_bytes: int = 1_572_864
    #: The leader steps down (health NOT_SERVING, lease released) when this many store writes
    #: failed in a row, or when writes have kept failing for this long, whichever comes first.
    store_failed_writes_to_step_down: int = 5
    store_failing_s_to_step_down: float = 10.0
    #: With mTLS: which client certificates may act as which host. "" (off), "exact" (a SAN
    #: DNS name, SAN URI or the CN equals the host id) or a pattern with {host_id} in it, e.g.
    #: "{host_id}.agents.example.com" or "spiffe://example.com/agent/{host_id}".
    bind_client_cert_to_host: str = ""
    #: How many past quorums and events the status API keeps.
    recent_quorums: int = 50
    recent_events: int = 1000
    #: Replica digests: the longest accepted (hex digits), how many recent steps' digests are
    #: kept for comparison, and how long a step's comparison waits for the other replicas.
    max_digest_chars: int = 128
    digest_steps_kept: int = 16
    digest_wait_s: float = 30.0
    #: Largest gRPC answer sent (a quorum answer carries every member's addresses).
    max_message_bytes: int = 64 << 20
    #: A connection to the quorum port (the coordinators' fast path beside QuorumStream) must send
    #: its first join (and finish its TLS handshake) within this long, or it is closed.
    quorum_port_hello_s: float = 5.0
    #: Once a frame has begun on a quorum port connection, the rest of it must arrive within
    #: this long (a coordinator's 8 MiB join takes milliseconds), or the connection is closed...
    quorum_port_frame_s: float = 5.0
    #: ...and the bytes of unfinished frames held over all its connections together stay under
    #: this (whatever the job's size): a connection that would pass it is refused
    #: (RESOURCE_EXHAUSTED; its coordinator uses gRPC). At least one largest frame.
    quorum_port_buffer_bytes: int = 32 << 20
    #: Grace period for in-flight calls when the server stops.
    stop_grace_s: float = 2.0
    #: The leader's lease in the store (etcd: whole seconds, at least 1): a standby takes over
    #: about this long after the leader stopped renewing it.
    lease_ttl_s: float = 5.0
    #: What the controller may assume of its clients (agents, replica coordinators): the longest
    #: pause between two passes over the controller addresses (agents: reconnect_cap_s)...
    client_backoff_cap_s: float = 1.0
    #: ...how long a working controller may take to answer the call that reconnects a client
    #: (a registration written to the store, a first heartbeat)...
    client_call_s: float = 1.0
    #: ...and how long a client waits on a controller that does not answer (a frozen process,
    #: a partition) before it tries the next address (agents: rpc_timeout_s).
    client_timeout_s: float = 5.0
    #: When no live replica holds the newest committed step, how long a round waits for the
    #: replicas that held it to come back before it forms a rollback quorum (0: do not wait).
    rollback_wait_s: float = 20.0
    #: Live goodput, failure histograms and the JSON event log. Off only to measure their cost.
    telemetry: bool = True
    #: Hangs, stragglers and silent data corruption: what is found and what is done about it
    #: (in the JSON settings file: an object under "diagnosis").
    diagnosis: DiagnosisSettings = field(default_factory=DiagnosisSettings)

    @property
    def reconnect_cycle_s(self) -> float:
        """How long a live client may stay unheard while the leader can be reached: one
        capped pause, then the call that reconnects it. The heartbeat timeout must cover it."""
        return self.client_backoff_cap_s + self.client_call_s

    @property
    def takeover_grace_s(self) -> float:
        """After a takeover, silence is counted only from this long after it: a client may
        first have to give up on the old leader (client_timeout_s, when it froze rather than
        died), then complete a reconnect cycle. The lease TTL does not add to it: silence
        before the takeover (the old leader's end and the election, about a lease TTL) is
        forgiven outright, since the new leader restarts every last-seen time."""
        return self.client_timeout_s + self.reconnect_cycle_s

    def timeout_values(self) -> dict[str, float]:
        """Every timeout of the controller by field name (diagnosis ones as "diagnosis.NAME"):
        what protos/timeout_rules.py judges."""
        names = [n for n in timeout_rules.WAITS if n.startswith(timeout_rules.CONTROLLER + ".")]
        values = {}
        for name in names:
            field_name = name.split(".", 1)[1]
            owner, attr = (self.diagnosis, field_name.split(".", 1)[1]) if "." in field_name else (self, field_name)
            values[field_name] = getattr(owner, attr)
        return values

    @property
    def max_replica_records(self) -> int:
        """Most replica ids the controller keeps: room for restarts and renames, but bounded."""
        return 4 * self.replicas + 16

    def _bound_problems(self) -> list[str]:
        """The counts and sizes: each within its bounds."""
        problems = []
        for name in ("ranks_per_host", "max_world_size", "max_id_chars", "max_address_chars", "recent_quorums",
                     "recent_events", "max_message_bytes", "digest_steps_kept", "max_hosts", "max_slots_per_host", "max_request_bytes",
                     "store_failed_writes_to_step_down"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}.")
        if not 8 <= self.max_digest_chars <= 1024:
            problems.append(f"max_digest_chars must be 8..1024, got {self.max_digest_chars}.")
        if not MIN_REASON_CHARS <= self.max_reason_chars <= MAX_REASON_CHARS:
            problems.append(f"max_reason_chars must be {MIN_REASON_CHARS}..{MAX_REASON_CHARS}, "
                            f"got {self.max_reason_chars}.")
        if self.max_world_size > MAX_WORLD_SIZE:
            problems.append(f"max_world_size must be at most {MAX_WORLD_SIZE}, got {self.max_world_size}.")
        if self.recent_events > MAX_RECENT:
            problems.append(f"recent_events must be at most {MAX_RECENT}, got {self.recent_events}.")
        if self.recent_quorums > MAX_RECENT:
            problems.append(f"recent_quorums must be at most {MAX_RECENT}, got {self.recent_quorums}.")
        if self.ranks_per_host > self.max_slots_per_host:
            problems.append(f"ranks_per_host ({self.ranks_per_host}) exceeds max_slots_per_host "
                            f"({self.max_slots_per_host}).")
        if self.store_max_request_bytes < MIN_STORE_REQUEST_BYTES:
            problems.append(f"store_max_request_bytes must be at least {MIN_STORE_REQUEST_BYTES}, "
                            f"got {self.store_max_request_bytes}.")
        return problems

    def validate(self) -> "ControllerSettings":
        problems = []
        if not self.job_id or len(self.job_id) > self.max_id_chars:
            problems.append(f"job_id must be 1..{self.max_id_chars} characters, got {self.job_id!r}.")
        if self.replicas < 1:
            problems.append(f"replicas must be at least 1, got {self.replicas}.")
        if not 1 <= self.min_replicas <= max(self.replicas, 1):
            problems.append(
                f"min_replicas must be between 1 and replicas ({self.replicas}), got {self.min_replicas}."
            )
        for name in ("join_timeout_s", "heartbeat_timeout_s", "stop_grace_s", "digest_wait_s", "lease_ttl_s",
                     "restart_window_s", "quorum_port_hello_s", "quorum_port_frame_s", "fail_after_s",
                     "client_backoff_cap_s", "client_call_s", "client_timeout_s", "store_failing_s_to_step_down"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a positive number of seconds, got {value}.")
        if self.quorum_port_buffer_bytes < self.max_request_bytes + 8:
            problems.append(f"quorum_port_buffer_bytes must hold at least one largest frame (max_request_bytes + "
                            f"8 = {self.max_request_bytes + 8}), got {self.quorum_port_buffer_bytes}.")
        if not 0 <= self.restart_budget <= MAX_RESTART_BUDGET:
            problems.append(f"restart_budget must be between 0 and {MAX_RESTART_BUDGET} (each host's record keeps "
                            f"that many restart times), got {self.restart_budget}.")
        if self.rollback_wait_s < 0:
            problems.append(f"rollback_wait_s must not be negative, got {self.rollback_wait_s}.")
        if self.lr_policy not in LR_POLICIES:
            problems.append(f"lr_policy must be one of {', '.join(LR_POLICIES)}, got {self.lr_policy!r}.")
        problems += _sync_problems(self)
        if self.hosts_per_replica < 0:
            problems.append(f"hosts_per_replica must not be negative, got {self.hosts_per_replica}.")
        if self.hosts_per_replica * self.ranks_per_host > self.max_world_size:
            problems.append(f"hosts_per_replica × ranks_per_host ({self.hosts_per_replica * self.ranks_per_host}) "
                            f"exceeds max_world_size ({self.max_world_size}).")
        problems += self._bound_problems()
        binding = self.bind_client_cert_to_host
        if binding and binding != "exact" and "{host_id}" not in binding:
            problems.append(f"bind_client_cert_to_host must be empty, 'exact' or a pattern containing "
                            f"{{host_id}}, got {binding!r}.")
        try:
            self.diagnosis.validate()
        except ValueError as exc:
            problems.append(str(exc))
        if not problems:  # the timeout hierarchy (protos/timeout_rules.py), once every value is valid alone
            problems += timeout_rules.problems(timeout_rules.CONTROLLER, self.timeout_values())
        if not problems:
            from controller.core.sizes import replicas_section_problem

            problem = replicas_section_problem(self)
            if problem:
                problems.append(problem)
        if problems:
            raise ValueError(" ".join(problems))
        return self

    @classmethod
    def from_file(cls, path: str | Path, **overrides) -> "ControllerSettings":
        """Defaults, then the JSON file, then `overrides` (flags), validated."""
        return cls.merged(path, **overrides).validate()

    @classmethod
    def merged(cls, path: str | Path, **overrides) -> "ControllerSettings":
        """Defaults, then the JSON file, then `overrides` (flags; None: not given), not yet
        validated (`fthsdp timeouts` judges them rule by rule)."""
        data = json.loads(Path(path).read_text()) if path else {}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Settings file {path} has unknown keys: {', '.join(unknown)}.")
        if isinstance(data.get("diagnosis"), dict):
            nested = data["diagnosis"]
            unknown = sorted(set(nested) - {f.name for f in fields(DiagnosisSettings)})
            if unknown:
                raise ValueError(f"Settings file {path} has unknown keys under diagnosis: {', '.join(unknown)}.")
            data = dict(data, diagnosis=DiagnosisSettings(**nested))
        merged = replace(cls(), **data)
        return replace(merged, **{k: v for k, v in overrides.items() if v is not None})


def _sync_problems(s: "ControllerSettings") -> list[str]:
    """What is wrong with how the replicas meet: the mode, H, and F (protos/sync_modes.py)."""
    return sync_modes.schedule_problems(s.sync_mode, s.sync_every_steps, s.sync_fragments)

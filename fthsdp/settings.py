"""Trainer runtime settings: one frozen dataclass, units in the field names.

Environment variables (names below) fill the fields that `RuntimeSettings.from_env`
reads; keyword arguments given to `from_env` win over the environment, and the
environment wins over the defaults.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

ENV_JOB_ID = "FTHSDP_JOB_ID"
ENV_REPLICA_ID = "FTHSDP_REPLICA_ID"
ENV_RANK = "FTHSDP_RANK"
ENV_WORLD_SIZE = "FTHSDP_WORLD_SIZE"
ENV_CONTROLLER = "FTHSDP_CONTROLLER"
ENV_LEADER_ADDRESS = "FTHSDP_LEADER_ADDRESS"
ENV_CHECKPOINT_DIR = "FTHSDP_CHECKPOINT_DIR"

LR_POLICIES = ("quorum", "none", "linear", "sqrt")


@dataclass(frozen=True)
class RuntimeSettings:
    """How one trainer process of one replica behaves.

    job_id: the job, shared by every replica; part of FTAR group ids.
    replica_id: this replica's id (replicas are ordered by it in FTAR rings).
    rank / world_size: this process inside its replica; rank 0 is the leader.
    controller_address: host:port of the controller's gRPC service (leader only).
    leader_address: host:port where rank 0 hosts the intra-replica channel.
    bind_host: interface for the state server, FTAR endpoint and channel.
    max_retries: failed steps in a row tolerated before the runtime raises.
    lr_policy: "quorum" applies the quorum answer's lr_scale (the controller's
        policy, sqrt by default); "none" | "linear" | "sqrt" compute it here
        from healthy/total replicas.
    quorum_timeout_s: longest wait for one quorum answer (leader) or plan (ranks).
    allreduce_timeout_s: longest wait for one FTAR all-reduce.
    vote_timeout_s: longest the leader waits for every rank's vote.
    fetch_timeout_s: longest one catch-up fetch may take before it counts as failed.
    fetch_attempts: tries per catch-up fetch (a bad checksum or a cut stream retries).
    fetch_hold_timeout_s: longest a source holds its optimizer step for fetchers.
    heartbeat_interval_s: how often the leader tells the controller it is alive.
    checkpoint_dir: durable checkpoints go here ("" disables them).
    checkpoint_every_steps: write a checkpoint after every N-th committed step.
    ftar_chunk_bytes / ftar_chunks_in_flight: FTAR transport tuning.
    """

    job_id: str = "job"
    replica_id: str = "0"
    rank: int = 0
    world_size: int = 1
    controller_address: str = ""
    leader_address: str = ""
    bind_host: str = "127.0.0.1"
    max_retries: int = 5
    lr_policy: str = "quorum"
    quorum_timeout_s: float = 60.0
    allreduce_timeout_s: float = 30.0
    vote_timeout_s: float = 60.0
    fetch_timeout_s: float = 60.0
    fetch_attempts: int = 3
    fetch_hold_timeout_s: float = 30.0
    heartbeat_interval_s: float = 1.0
    checkpoint_dir: str = ""
    checkpoint_every_steps: int = 0
    ftar_chunk_bytes: int = 4 << 20
    ftar_chunks_in_flight: int = 2

    def validate(self) -> "RuntimeSettings":
        problems = []
        if not self.job_id:
            problems.append("job_id must not be empty.")
        if not self.replica_id:
            problems.append("replica_id must not be empty.")
        if not 1 <= self.world_size <= 8192:
            problems.append(f"world_size must be between 1 and 8192, got {self.world_size}.")
        if not 0 <= self.rank < max(self.world_size, 1):
            problems.append(f"rank must be in [0, world_size={self.world_size}), got {self.rank}.")
        if self.rank == 0 and not self.controller_address:
            problems.append("controller_address must be set on rank 0 (the leader talks to the controller).")
        if self.world_size > 1 and not self.leader_address:
            problems.append("leader_address must be set when world_size > 1 (ranks reach their leader there).")
        if self.max_retries < 0:
            problems.append(f"max_retries must be >= 0, got {self.max_retries}.")
        if self.lr_policy not in LR_POLICIES:
            problems.append(f"lr_policy must be one of {LR_POLICIES}, got {self.lr_policy!r}.")
        for name in ("quorum_timeout_s", "allreduce_timeout_s", "vote_timeout_s", "fetch_timeout_s",
                     "fetch_hold_timeout_s", "heartbeat_interval_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0 seconds, got {getattr(self, name)}.")
        if self.fetch_attempts < 1:
            problems.append(f"fetch_attempts must be >= 1, got {self.fetch_attempts}.")
        if self.checkpoint_every_steps < 0:
            problems.append(f"checkpoint_every_steps must be >= 0, got {self.checkpoint_every_steps}.")
        if self.checkpoint_every_steps > 0 and not self.checkpoint_dir:
            problems.append("checkpoint_dir must be set when checkpoint_every_steps > 0.")
        if self.ftar_chunk_bytes <= 0 or self.ftar_chunks_in_flight <= 0:
            problems.append(f"ftar_chunk_bytes and ftar_chunks_in_flight must be > 0, got "
                            f"{self.ftar_chunk_bytes} and {self.ftar_chunks_in_flight}.")
        if problems:
            raise ValueError("Invalid RuntimeSettings: " + " ".join(problems))
        return self

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, **overrides: object) -> "RuntimeSettings":
        """Defaults, then the FTHSDP_* environment, then `overrides` (which win)."""
        env: dict[str, object] = {}
        for var, field, conv in (
            (ENV_JOB_ID, "job_id", str), (ENV_REPLICA_ID, "replica_id", str),
            (ENV_RANK, "rank", int), (ENV_WORLD_SIZE, "world_size", int),
            (ENV_CONTROLLER, "controller_address", str),
            (ENV_LEADER_ADDRESS, "leader_address", str),
            (ENV_CHECKPOINT_DIR, "checkpoint_dir", str),
        ):
            if os.environ.get(var):
                env[field] = conv(os.environ[var])
        env.update(overrides)
        return dataclasses.replace(cls(), **env).validate()

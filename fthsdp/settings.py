"""Trainer runtime settings: one frozen dataclass, units in the field names.

`RuntimeSettings.from_env()` reads torchrun's variables and this project's, in this order
(later wins): the defaults, torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), the FTHSDP_* variables below, then the keyword arguments given to `from_env`.

The coordinator address, when neither FTHSDP_COORDINATOR_ADDRESS nor a keyword gives it,
is derived from torchrun's: MASTER_ADDR:(MASTER_PORT + 1) -- rank 0 runs on MASTER_ADDR's
host under torchrun, and MASTER_PORT itself is taken by torch.distributed's store. A
replica of one rank needs none (its coordinator takes a free port). The controller address
is needed on rank 0 only: rank 0 hosts the coordinator, the only part that calls it.

The job secret that authenticates this trainer's ports comes from FTHSDP_JOB_SECRET_FILE (a
file, e.g. a mounted Kubernetes Secret) or FTHSDP_JOB_SECRET (the value; how the agent passes
it), the file winning; a `job_secret` keyword wins over both (see protos/job_secret.py).
Without one the ports refuse to start unless FTHSDP_INSECURE_TRAINER_PORTS=1.

Every timeout can be set from the environment (TIMEOUT_ENV: FTHSDP_QUORUM_TIMEOUT_S,
FTHSDP_GATHER_TIMEOUT_S, FTHSDP_ALLREDUCE_TIMEOUT_S, FTHSDP_FETCH_TIMEOUT_S,
FTHSDP_FETCH_HOLD_TIMEOUT_S, FTHSDP_HELLO_TIMEOUT_S, FTHSDP_HEARTBEAT_INTERVAL_S,
FTHSDP_CONTROLLER_HEARTBEAT_TIMEOUT_S, FTHSDP_CONNECT_TIMEOUT_S), a keyword argument winning
over the variable; `validate()` refuses values that break the timeout hierarchy
(protos/timeout_rules.py, docs/operations.md "Timeouts"), naming both values.

A warm spare's standby (FTHSDP_STANDBY=1 in the process's own environment: an agent started
with --standby pre-starts it while the host is a spare) waits inside `from_env()` for the
agent's hand-over (agent.env.wait_for_assignment), so every script is a correct warm spare:
what it did before `from_env()` (imports, data set-up) is the warm part, and it reads the
assignment's variables as a cold start would. A script that calls `wait_for_assignment()`
itself first is not asked again (the hand-over clears FTHSDP_STANDBY). An explicit `environ`
mapping is read as given (no wait).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from fthsdp.errors import InvalidSettings
from fthsdp.step.relay_tree import RelayTree
from protos import dial, job_secret, timeout_rules
from protos.job_secret import JobSecret
from protos import sync_modes
from protos.sync_modes import SYNC_MODES

ENV_JOB_ID = "FTHSDP_JOB_ID"
ENV_REPLICA_ID = "FTHSDP_REPLICA_ID"
ENV_RANK = "FTHSDP_RANK"
ENV_WORLD_SIZE = "FTHSDP_WORLD_SIZE"
ENV_LOCAL_RANK = "FTHSDP_LOCAL_RANK"
ENV_CONTROLLER = "FTHSDP_CONTROLLER"
ENV_COORDINATOR_ADDRESS = "FTHSDP_COORDINATOR_ADDRESS"
ENV_CHECKPOINT_DIR = "FTHSDP_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_STEPS = "FTHSDP_CHECKPOINT_EVERY_STEPS"
ENV_MAX_STEPS = "FTHSDP_MAX_STEPS"
ENV_RELAY_FANOUT = "FTHSDP_RELAY_FANOUT"
ENV_REPLICA_VERSION = "FTHSDP_REPLICA_VERSION"
ENV_JOB_SECRET_FILE = job_secret.ENV_JOB_SECRET_FILE
ENV_JOB_SECRET = job_secret.ENV_JOB_SECRET
ENV_INSECURE_TRAINER_PORTS = job_secret.ENV_INSECURE_TRAINER_PORTS
ENV_DETERMINISTIC = "FTHSDP_DETERMINISTIC"
ENV_CONNECT_TIMEOUT_S = dial.ENV_CONNECT_TIMEOUT_S
ENV_RECONNECT_TIMEOUT_S = dial.ENV_RECONNECT_TIMEOUT_S
ENV_QUORUM_TIMEOUT_S = "FTHSDP_QUORUM_TIMEOUT_S"
ENV_GATHER_TIMEOUT_S = "FTHSDP_GATHER_TIMEOUT_S"
ENV_ALLREDUCE_TIMEOUT_S = "FTHSDP_ALLREDUCE_TIMEOUT_S"
ENV_FETCH_TIMEOUT_S = "FTHSDP_FETCH_TIMEOUT_S"
ENV_FETCH_HOLD_TIMEOUT_S = "FTHSDP_FETCH_HOLD_TIMEOUT_S"
ENV_HELLO_TIMEOUT_S = "FTHSDP_HELLO_TIMEOUT_S"
ENV_HEARTBEAT_INTERVAL_S = "FTHSDP_HEARTBEAT_INTERVAL_S"
ENV_CONTROLLER_HEARTBEAT_TIMEOUT_S = "FTHSDP_CONTROLLER_HEARTBEAT_TIMEOUT_S"
#: Every timeout of the runtime (protos/timeout_rules.py) and the variable that sets it; a
#: keyword argument of `from_env` wins over the variable, which wins over the default.
TIMEOUT_ENV: dict[str, str] = {
    "quorum_timeout_s": ENV_QUORUM_TIMEOUT_S,
    "gather_timeout_s": ENV_GATHER_TIMEOUT_S,
    "allreduce_timeout_s": ENV_ALLREDUCE_TIMEOUT_S,
    "fetch_timeout_s": ENV_FETCH_TIMEOUT_S,
    "fetch_hold_timeout_s": ENV_FETCH_HOLD_TIMEOUT_S,
    "hello_timeout_s": ENV_HELLO_TIMEOUT_S,
    "heartbeat_interval_s": ENV_HEARTBEAT_INTERVAL_S,
    "controller_heartbeat_timeout_s": ENV_CONTROLLER_HEARTBEAT_TIMEOUT_S,
    "connect_timeout_s": ENV_CONNECT_TIMEOUT_S,
    "reconnect_timeout_s": ENV_RECONNECT_TIMEOUT_S,
}
ENV_SYNC_MODE = "FTHSDP_SYNC_MODE"
ENV_SYNC_EVERY_STEPS = "FTHSDP_SYNC_EVERY_STEPS"
ENV_OUTER_LR = "FTHSDP_OUTER_LR"
ENV_OUTER_MOMENTUM = "FTHSDP_OUTER_MOMENTUM"
ENV_OUTER_NESTEROV = "FTHSDP_OUTER_NESTEROV"
ENV_SYNC_FRAGMENTS = "FTHSDP_SYNC_FRAGMENTS"
ENV_SYNC_WIRE_DTYPE = "FTHSDP_SYNC_WIRE_DTYPE"
ENV_SYNC_OVERLAP_STEPS = "FTHSDP_SYNC_OVERLAP_STEPS"
ENV_SYNC_PLAN_AHEAD_STEPS = "FTHSDP_SYNC_PLAN_AHEAD_STEPS"
#: the pseudo-gradient's precision on the cross-replica wire (fthsdp/sync/outer.py)
SYNC_WIRE_DTYPES = ("float32", "bfloat16")
# torchrun's, read when the FTHSDP_* variable of the same meaning is not set
TORCHRUN_RANK = "RANK"
TORCHRUN_WORLD_SIZE = "WORLD_SIZE"
TORCHRUN_LOCAL_RANK = "LOCAL_RANK"
TORCHRUN_MASTER_ADDR = "MASTER_ADDR"
TORCHRUN_MASTER_PORT = "MASTER_PORT"
#: the coordinator listens this many ports above torchrun's MASTER_PORT
COORDINATOR_PORT_OFFSET = 1
#: added to the bounds a rank derives from the settings, for messages in flight
GRACE_S = 5.0

MAX_WORLD_SIZE = 8192
#: the most ranks one relay serves (fthsdp/step/relay_messages.py bounds its frames by it)
MAX_RELAY_GROUP_RANKS = 1024


@dataclass(frozen=True)
class RuntimeSettings:
    """How one trainer process of one replica behaves.

    job_id: the job, shared by every replica; part of FTAR group ids.
    replica_id: this replica's id (replicas are ordered by it in FTAR rings).
    rank / world_size: this process inside its replica; rank 0 hosts the coordinator.
    local_rank: this process's index on its host (torchrun's LOCAL_RANK; device choice).
    controller_address: host:port[,host:port...] of the controller's gRPC service (rank 0).
    coordinator_address: host:port where rank 0 hosts the replica's coordinator, and listens
        ("" with world_size 1: a free port on bind_host).
    bind_host: interface for the state server and the FTAR endpoint (other replicas reach them).
    max_steps: the replica finishes after committing this many steps (0: no limit).
    max_retries: failed steps in a row tolerated before the runtime raises.
    apply_lr_scale: multiply the learning rate by the quorum's lr_scale for each step
        (the controller's --lr-policy decides it, from healthy/total replicas).
    quorum_timeout_s: longest the coordinator waits for one quorum answer; also how long
        ranks have to connect to the coordinator at start.
    gather_timeout_s: once the first rank's begin, vote or digest of a round arrived, how
        long the coordinator waits for every other rank's; silence past it is a "no". At least
        allreduce_timeout_s (a rank votes once its all-reduce ended).
    allreduce_timeout_s: longest wait for one FTAR all-reduce.
    fetch_timeout_s: longest one catch-up fetch attempt may take.
    fetch_attempts: tries per catch-up (a bad checksum or a cut stream tries again).
    fetch_hold_timeout_s: longest a source holds its optimizer step for its fetchers (or,
        serving an immutable copy, keeps serving it to them).
    copy_state_to_serve: a catch-up source copies its CPU state at the step boundary and trains
        on while fetchers read the copy (one more copy of this rank's state in memory). State
        on a GPU is always copied, into pinned host memory; CPU state is otherwise served in
        place and the source holds its optimizer step until its fetchers have it.
    digest_every_steps: report a digest of the committed state after every N-th step
        (the same N on every replica, so digests of one step meet at the controller; 0:
        only after catch-ups).
    heartbeat_interval_s: how often rank 0 tells the controller the replica is alive.
    controller_heartbeat_timeout_s: the controller's --heartbeat-timeout-s as this replica assumes
        it (the runtime cannot ask the controller): heartbeat_interval_s must leave room for two
        lost beats within it. Set it (FTHSDP_CONTROLLER_HEARTBEAT_TIMEOUT_S) when the controller
        runs with another heartbeat timeout than its default.
    connect_timeout_s: rank 0 gives up (ControllerUnreachable, a Fatal error) when no controller
        address answered its first call for this long (FTHSDP_CONNECT_TIMEOUT_S, default 60 s): a
        wrong address or a missing controller ends the replica non-zero soon, as the agent's
        --connect-timeout-s (same default). Failed attempts are logged once per doubling of
        their count, with the address and the reason (protos.dial.Outage).
    reconnect_timeout_s: the same once a controller had answered (FTHSDP_RECONNECT_TIMEOUT_S,
        default 300 s, as the agent's --reconnect-timeout-s): keep it above a controller
        failover's or restart's time.
    checkpoint_dir: durable checkpoints go here ("" disables them; FTHSDP_CHECKPOINT_DIR).
    checkpoint_every_steps: write a checkpoint after every N-th committed step
        (FTHSDP_CHECKPOINT_EVERY_STEPS).
    checkpoint_keep_last: how many complete checkpoints to keep (older ones are removed; 0: all).
    ftar_chunk_bytes / ftar_chunks_in_flight: FTAR transport tuning.
    job_secret: the job's secret; it authenticates the coordinator's hello, FTAR hellos and
        state-server requests (each with its own key). Never shown in a repr.
    insecure_trainer_ports: with no job_secret, run those ports without authentication
        (anyone who reaches them may take part); without either, the ports refuse to start.
    hello_timeout_s: how long a connection to this rank's coordinator or state server may take
        to authenticate before it is closed.
    deterministic: reproducible runs for silent-data-corruption hunts (fthsdp/determinism.py):
        deterministic kernels, and the runtime owns the RNG streams (seeded with
        deterministic_seed unless the script registered them itself).
    relay_fanout: ranks per relay group (fthsdp/step/relay_tree.py): 0 lets every rank talk to
        the coordinator up to 64 ranks and makes groups of about sqrt(world_size) above; a
        value >= world_size means no relays at any size. At most 1,024 when there are relays.
        The same on every rank of the replica (FTHSDP_RELAY_FANOUT).
    replica_version: the controller's version of the replica's restart this process was started
        under (FTHSDP_REPLICA_VERSION, set by the agent; 0: unknown). Carried in the rank's
        hello: a coordinator or relay of another restart refuses it (fthsdp/step/incarnations.py).
    sync_mode: how replicas meet (FTHSDP_SYNC_MODE; the controller's --sync-mode must agree):
        "sync" (every step: gradients are averaged); "local_sgd" (every sync_every_steps inner
        steps on the replica's own group, the parameters are averaged); "diloco" (every
        sync_every_steps inner steps, the pseudo-gradient global - local is averaged and the
        outer optimizer, SGD with outer_lr / outer_momentum / outer_nesterov, applies it);
        "streaming_diloco" (diloco with the model cut into sync_fragments fragments, each synced
        every sync_every_steps inner steps on its own staggered schedule: one fragment's sync
        every sync_every_steps / sync_fragments inner steps). In the semi-synchronous modes a
        step of the protocol (`Manager.step`, max_steps, checkpoint and digest periods) is one
        sync (of one fragment in streaming_diloco); see docs/architecture.md.
    sync_every_steps: H, the inner steps between two syncs of the same parameters
        (FTHSDP_SYNC_EVERY_STEPS; 1 in "sync"; a multiple of sync_fragments).
    sync_fragments: F, the fragments of streaming_diloco (FTHSDP_SYNC_FRAGMENTS; 1 in every other
        mode; at most the model's number of trainable parameters). The controller's
        --sync-fragments must agree.
    sync_wire_dtype: the pseudo-gradient's precision on the cross-replica wire
        (FTHSDP_SYNC_WIRE_DTYPE): "float32", or "bfloat16" (half the bytes; every replica applies
        the same reduced bytes, so the global state stays bitwise equal). Semi-synchronous modes only.
    sync_overlap_steps: tau, streaming_diloco's overlap (FTHSDP_SYNC_OVERLAP_STEPS; None: the
        default, K - 1: see `overlap_steps`): a fragment's sync is prepared tau inner steps before it is due
        and its quorum and all-reduce run while the replica trains those tau inner steps; the
        result is applied at the due step (fthsdp/step/protocol.py). 0 syncs blocking, as the
        other modes do; at most K - 1 (K = sync_every_steps / sync_fragments). Those tau steps'
        change to the synced fragment is dropped at its commit (the fragment takes the new
        global value), as in torchft's streaming DiLoCo.
    sync_plan_ahead_steps: P, how many inner steps before a blocking sync is due its quorum is
        asked for (FTHSDP_SYNC_PLAN_AHEAD_STEPS; default 0: at the due step): the begin goes to
        the coordinator P steps early and the plan, once in, is held; the pseudo-gradient's
        all-reduce still starts at the due step, from the state after all K inner steps (the
        sync's arithmetic is unchanged; only its quorum round trip leaves the due step). At most
        K; semi-synchronous modes without an overlap only (an overlapped sync is asked for tau
        steps early already). For a controller whose round trip is long beside the replicas'
        skew; off by default: on bench.semisync it gained nothing (docs/architecture.md, "The
        quorum asked for ahead", has the figures and what it changes when a replica fails).
    outer_lr / outer_momentum / outer_nesterov: DiLoCo's outer SGD (FTHSDP_OUTER_LR,
        FTHSDP_OUTER_MOMENTUM, FTHSDP_OUTER_NESTEROV=0|1); the quorum's lr_scale multiplies
        outer_lr (the inner optimizer's learning rate is the script's). Unused by other modes.
    """

    job_id: str = "job"
    replica_id: str = "0"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    controller_address: str = ""
    coordinator_address: str = ""
    bind_host: str = "127.0.0.1"
    max_steps: int = 0
    max_retries: int = 5
    apply_lr_scale: bool = True
    quorum_timeout_s: float = 60.0
    gather_timeout_s: float = 60.0
    allreduce_timeout_s: float = 30.0
    fetch_timeout_s: float = 60.0
    fetch_attempts: int = 3
    fetch_hold_timeout_s: float = 30.0
    copy_state_to_serve: bool = False
    digest_every_steps: int = 100
    heartbeat_interval_s: float = 1.0
    controller_heartbeat_timeout_s: float = 10.0
    connect_timeout_s: float = dial.CONNECT_TIMEOUT_S
    reconnect_timeout_s: float = dial.RECONNECT_TIMEOUT_S
    checkpoint_dir: str = ""
    checkpoint_every_steps: int = 0
    checkpoint_keep_last: int = 3
    ftar_chunk_bytes: int = 4 << 20
    ftar_chunks_in_flight: int = 2
    job_secret: JobSecret | None = None
    insecure_trainer_ports: bool = False
    hello_timeout_s: float = 10.0
    deterministic: bool = False
    deterministic_seed: int = 0
    relay_fanout: int = 0
    replica_version: int = 0
    sync_mode: str = "sync"
    sync_every_steps: int = 1
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    outer_nesterov: bool = True
    sync_fragments: int = 1
    sync_wire_dtype: str = "float32"
    sync_overlap_steps: int | None = None
    sync_plan_ahead_steps: int = 0

    def validate(self) -> "RuntimeSettings":
        problems = []
        if not isinstance(self.replica_version, int) or self.replica_version < 0:
            problems.append(f"replica_version must be 0 (unknown) or positive, got {self.replica_version!r}.")
        if not self.job_id:
            problems.append("job_id must not be empty.")
        if not self.replica_id:
            problems.append("replica_id must not be empty.")
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            problems.append(f"world_size must be between 1 and {MAX_WORLD_SIZE}, got {self.world_size}.")
        if not 0 <= self.rank < max(self.world_size, 1):
            problems.append(f"rank must be in [0, world_size={self.world_size}), got {self.rank}.")
        if self.local_rank < 0:
            problems.append(f"local_rank must be >= 0, got {self.local_rank}.")
        if self.rank == 0 and not self.controller_address:
            problems.append(f"controller_address must be set on rank 0, which talks to the controller "
                            f"(set {ENV_CONTROLLER}).")
        if self.world_size > 1 and not self.coordinator_address:
            problems.append(f"coordinator_address must be set when world_size > 1 (ranks reach rank 0 there): "
                            f"set {ENV_COORDINATOR_ADDRESS}, or torchrun's {TORCHRUN_MASTER_ADDR} and "
                            f"{TORCHRUN_MASTER_PORT}.")
        if self.coordinator_address and not _is_host_port(self.coordinator_address):
            problems.append(f"coordinator_address must be host:port, got {self.coordinator_address!r}.")
        for name in ("max_steps", "max_retries", "digest_every_steps", "checkpoint_every_steps",
                     "checkpoint_keep_last"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}.")
        for name in ("apply_lr_scale", "copy_state_to_serve"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be True or False, got {getattr(self, name)!r}.")
        if self.job_secret is not None and not isinstance(self.job_secret, JobSecret):
            problems.append(f"job_secret must be a protos.job_secret.JobSecret, got a "
                            f"{type(self.job_secret).__name__}.")
        if not isinstance(self.insecure_trainer_ports, bool):
            problems.append(f"insecure_trainer_ports must be True or False, got {self.insecure_trainer_ports!r}.")
        if self.job_secret is None and self.insecure_trainer_ports is not True:
            problems.append(f"The trainer ports need the job secret: {job_secret.HOW_TO_PROVIDE}.")
        timed = True
        for name in TIMEOUT_ENV:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a finite number of seconds > 0, got {value!r}.")
                timed = False
        if timed:  # the timeout hierarchy (protos/timeout_rules.py)
            problems += timeout_rules.problems(timeout_rules.RUNTIME, self.timeout_values())
        if self.fetch_attempts < 1:
            problems.append(f"fetch_attempts must be >= 1, got {self.fetch_attempts}.")
        if self.checkpoint_every_steps > 0 and not self.checkpoint_dir:
            problems.append("checkpoint_dir must be set when checkpoint_every_steps > 0.")
        if not isinstance(self.deterministic, bool):
            problems.append(f"deterministic must be True or False, got {self.deterministic!r}.")
        if self.ftar_chunk_bytes <= 0 or self.ftar_chunks_in_flight <= 0:
            problems.append(f"ftar_chunk_bytes and ftar_chunks_in_flight must be > 0, got "
                            f"{self.ftar_chunk_bytes} and {self.ftar_chunks_in_flight}.")
        if not isinstance(self.relay_fanout, int) or self.relay_fanout < 0:
            problems.append(f"relay_fanout must be 0 (automatic) or a number of ranks >= 1, got {self.relay_fanout!r}.")
        elif self.relay_fanout < self.world_size and self.relay_fanout > MAX_RELAY_GROUP_RANKS:
            problems.append(f"relay_fanout must be at most {MAX_RELAY_GROUP_RANKS} ranks per relay (or >= world_size "
                            f"{self.world_size}: no relays), got {self.relay_fanout}.")
        problems += self._sync_problems()
        if problems:
            raise InvalidSettings("Invalid RuntimeSettings: " + " ".join(problems))
        return self

    def _sync_problems(self) -> list[str]:
        problems = sync_modes.schedule_problems(self.sync_mode, self.sync_every_steps, self.sync_fragments)
        if self.sync_mode not in SYNC_MODES:
            return problems
        if self.sync_wire_dtype not in SYNC_WIRE_DTYPES:
            problems.append(f"sync_wire_dtype must be one of {', '.join(SYNC_WIRE_DTYPES)}, got "
                            f"{self.sync_wire_dtype!r}.")
        elif self.sync_wire_dtype != "float32" and self.sync_mode == "sync":
            problems.append(f"sync_wire_dtype={self.sync_wire_dtype} needs a semi-synchronous sync_mode (it is the "
                            f"pseudo-gradient's precision); sync_mode 'sync' averages gradients in their own dtype.")
        problems += self._overlap_problems()
        problems += self._plan_ahead_problems()
        if not (isinstance(self.outer_lr, (int, float)) and math.isfinite(self.outer_lr) and self.outer_lr > 0):
            problems.append(f"outer_lr must be a finite number > 0, got {self.outer_lr!r}.")
        if not (isinstance(self.outer_momentum, (int, float)) and 0 <= self.outer_momentum < 1):
            problems.append(f"outer_momentum must be in [0, 1), got {self.outer_momentum!r}.")
        if not isinstance(self.outer_nesterov, bool):
            problems.append(f"outer_nesterov must be True or False, got {self.outer_nesterov!r}.")
        elif self.outer_nesterov and self.sync_mode in ("diloco", "streaming_diloco") and self.outer_momentum == 0:
            problems.append("outer_nesterov needs outer_momentum > 0 (torch's SGD refuses Nesterov without it).")
        return problems

    def _inner_steps_problems(self, name: str) -> list[str]:
        """A count of inner steps that is not an int >= 0 (None: unset, the default)."""
        value = getattr(self, name)
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return []
        return [f"{name} must be a number of inner steps >= 0, got {value!r}."]

    def _overlap_problems(self) -> list[str]:
        tau = self.sync_overlap_steps
        if tau is None or self._inner_steps_problems("sync_overlap_steps"):
            return self._inner_steps_problems("sync_overlap_steps")
        if tau and self.sync_mode != "streaming_diloco":
            return [f"sync_overlap_steps={tau} needs sync_mode streaming_diloco (got {self.sync_mode!r}); "
                    f"set it to 0 or leave it unset."]
        if tau and isinstance(self.sync_every_steps, int) and isinstance(self.sync_fragments, int) \
                and self.sync_fragments >= 1 and tau >= self.inner_steps_per_sync:
            return [f"sync_overlap_steps={tau} must be below sync_every_steps / sync_fragments = "
                    f"{self.inner_steps_per_sync} (a fragment's sync is prepared that many inner steps before it is "
                    f"due, after the previous one committed)."]
        return []

    def _plan_ahead_problems(self) -> list[str]:
        ahead = self.sync_plan_ahead_steps
        if ahead is None or self._inner_steps_problems("sync_plan_ahead_steps"):
            return self._inner_steps_problems("sync_plan_ahead_steps") or [
                "sync_plan_ahead_steps must be a number of inner steps >= 0, got None."]
        if not ahead:
            return []
        if self.sync_mode == "sync":
            return [f"sync_plan_ahead_steps={ahead} needs a semi-synchronous sync_mode (local_sgd, diloco, "
                    f"streaming_diloco); in 'sync' every step is a sync: set it to 0 or leave it unset."]
        if self._overlap_problems() or not isinstance(self.sync_every_steps, int) \
                or not isinstance(self.sync_fragments, int) or self.sync_fragments < 1:
            return []  # said already
        if self.overlap_steps:
            return [f"sync_plan_ahead_steps={ahead} with sync_overlap_steps={self.overlap_steps}: an overlapped "
                    f"sync asks for its quorum {self.overlap_steps} inner steps early already; set one of them to 0."]
        if ahead > self.inner_steps_per_sync:
            return [f"sync_plan_ahead_steps={ahead} must be at most sync_every_steps / sync_fragments = "
                    f"{self.inner_steps_per_sync} (the quorum is asked for after the previous sync committed)."]
        return []

    @property
    def overlap_steps(self) -> int:
        """tau: the inner steps a fragment's sync overlaps: sync_overlap_steps, or by default
        K - 1 in streaming_diloco (K = sync_every_steps / sync_fragments), 0 in other modes.

        Why K - 1, the longest the schedule allows: it was chosen when the Manager fed a sync's
        events only between inner steps (the plan was in at the end of inner step K - tau at the
        earliest, so the all-reduce overlapped at most tau - 1 inner steps). The flight waker
        (fthsdp/step/flight_waker.py) now moves the sync inside inner steps too; measured again
        with it (same bench, 1-minute loads 1.3-3.3): streaming / DiLoCo 0.92 at tau = 1 (its
        due steps still waited 52 ms per 8 inner steps: the quorum and the all-reduce do not fit
        in one inner step), 0.84 and 0.96 at tau = 2 (26-61 ms), 1.28 at tau = 3 (15 ms; 0.87-0.97
        in four more runs at loads of 1.7-2.7): K - 1 still waits least. Measured before it,
        with bench.semisync (2 replicas, H = 8, F = 2, K = 4, a 50 MB/s veth link, a
        2-core machine loaded by other work), streaming samples/s over DiLoCo's in the same run:
        0.53-0.91 at tau = 1 (4 runs), 0.77-0.95 at tau = 2 (4 runs), 0.83-1.33 at tau = 3 = K - 1
        (6 runs at 1-minute loads of 2 to 6, 1.09 and 1.12 once the look between inner steps
        stopped waiting 1 ms; 3.1 in one at a load of 13): only K - 1 reached DiLoCo, and the time left at each due step fell from about 27 ms at tau = 1
        to 7-21 ms. The price: the tau overlap steps' change to the
        synced fragment is dropped at its commit (tau / H of each fragment's inner steps); where
        inner steps are long enough to hide a sync in fewer of them, a smaller tau drops less."""
        if self.sync_overlap_steps is not None:
            return self.sync_overlap_steps
        if self.sync_mode == "streaming_diloco":
            return self.inner_steps_per_sync - 1
        return 0

    @property
    def semi_synchronous(self) -> bool:
        """Replicas meet every sync_every_steps inner steps, not every step."""
        return self.sync_mode != "sync"

    @property
    def inner_steps_per_sync(self) -> int:
        """Inner steps between two syncs of the protocol (of any fragment): H / F (1 in "sync")."""
        return self.sync_every_steps // self.sync_fragments

    def fragment_at(self, step: int) -> int:
        """The fragment the sync of protocol step `step` carries: after it the replica has trained
        (step + 1)·H/F inner steps, and fragment f is due when that is ≡ f·H/F (mod H), as in the
        Streaming DiLoCo paper. 0 in every mode but streaming_diloco."""
        return (step + 1) % self.sync_fragments

    def port_key(self, purpose: str) -> bytes | None:
        """The key of one trainer port (protos.job_secret.PURPOSE_*); None when the ports run
        without authentication. ValueError (how to provide a secret) when neither is set."""
        if self.job_secret is not None:
            return self.job_secret.key(purpose)
        if self.insecure_trainer_ports is True:
            return None
        raise InvalidSettings(f"The trainer ports need the job secret: {job_secret.HOW_TO_PROVIDE}.")

    def relay_tree(self) -> RelayTree:
        """This replica's relay tree (fthsdp/step/relay_tree.py)."""
        return RelayTree.for_world(self.world_size, self.relay_fanout)

    def timeout_values(self) -> dict[str, float]:
        """Every timeout of the runtime by field name: what protos/timeout_rules.py judges."""
        return {name: getattr(self, name) for name in TIMEOUT_ENV}

    # -- bounds a rank derives (every wait in the step is one of these)

    @property
    def plan_timeout_s(self) -> float:
        """A rank's longest wait for the answer to its begin: the other ranks' begins, then the quorum."""
        return self.gather_timeout_s + self.quorum_timeout_s + GRACE_S

    @property
    def decision_timeout_s(self) -> float:
        """A rank's longest wait for the decision after it voted."""
        return self.gather_timeout_s + GRACE_S

    @property
    def fetch_budget_s(self) -> float:
        """Longest a catch-up may take in all its attempts."""
        return self.fetch_timeout_s * self.fetch_attempts

    @property
    def finish_timeout_s(self) -> float:
        """A rank's longest wait, after close(), for the coordinator to report the replica finished."""
        return self.gather_timeout_s + 2 * GRACE_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> "RuntimeSettings":
        """Defaults, then torchrun's variables, then FTHSDP_*, then `overrides` (which win)."""
        env = os.environ if environ is None else environ
        if environ is None:
            _wait_if_standby()
        values: dict[str, object] = {}
        for field, conv, names in _ENV_FIELDS:
            for name in names:  # later names win
                if env.get(name, "") != "":
                    values[field] = _convert(name, env[name], conv)
        if "coordinator_address" not in values and "coordinator_address" not in overrides:
            values["coordinator_address"] = _coordinator_from_torchrun(env)
        try:
            if "job_secret" not in overrides:
                values["job_secret"] = job_secret.from_env(env)
            values["insecure_trainer_ports"] = job_secret.insecure_from_env(env)
        except ValueError as exc:
            raise InvalidSettings(f"Invalid RuntimeSettings: {exc}.") from None
        values.update(overrides)
        return dataclasses.replace(cls(), **values).validate()


def _wait_if_standby() -> None:
    """A standby of this process's environment blocks here until its agent hands it an
    assignment (which sets the assignment's variables in os.environ)."""
    from agent import env as agent_env

    if agent_env.is_standby():
        # stderr itself: the script may not have configured logging yet (the agent echoes this)
        print("fthsdp: standby: set up; waiting for the agent to hand over an assignment", file=sys.stderr, flush=True)
        agent_env.wait_for_assignment()


def _seconds(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidSettings(f"Invalid RuntimeSettings: environment variable {name}={text!r} is not a number of "
                              f"seconds.") from None


def _int(text: str) -> int:
    return int(text)


_ENV_FIELDS: tuple[tuple[str, Callable[[str], object], tuple[str, ...]], ...] = (
    ("job_id", str, (ENV_JOB_ID,)),
    ("replica_id", str, (ENV_REPLICA_ID,)),
    ("rank", _int, (TORCHRUN_RANK, ENV_RANK)),
    ("world_size", _int, (TORCHRUN_WORLD_SIZE, ENV_WORLD_SIZE)),
    ("local_rank", _int, (TORCHRUN_LOCAL_RANK, ENV_LOCAL_RANK)),
    ("controller_address", str, (ENV_CONTROLLER,)),
    ("coordinator_address", str, (ENV_COORDINATOR_ADDRESS,)),
    ("checkpoint_dir", str, (ENV_CHECKPOINT_DIR,)),
    ("checkpoint_every_steps", _int, (ENV_CHECKPOINT_EVERY_STEPS,)),
    ("max_steps", _int, (ENV_MAX_STEPS,)),
    ("deterministic", lambda text: _flag(ENV_DETERMINISTIC, text), (ENV_DETERMINISTIC,)),
    ("relay_fanout", _int, (ENV_RELAY_FANOUT,)),
    ("replica_version", _int, (ENV_REPLICA_VERSION,)),
    *((name, functools.partial(_seconds, env), (env,)) for name, env in TIMEOUT_ENV.items()),
    ("sync_mode", str, (ENV_SYNC_MODE,)),
    ("sync_every_steps", _int, (ENV_SYNC_EVERY_STEPS,)),
    ("outer_lr", lambda text: _number(ENV_OUTER_LR, text), (ENV_OUTER_LR,)),
    ("outer_momentum", lambda text: _number(ENV_OUTER_MOMENTUM, text), (ENV_OUTER_MOMENTUM,)),
    ("outer_nesterov", lambda text: _flag(ENV_OUTER_NESTEROV, text), (ENV_OUTER_NESTEROV,)),
    ("sync_fragments", _int, (ENV_SYNC_FRAGMENTS,)),
    ("sync_wire_dtype", str, (ENV_SYNC_WIRE_DTYPE,)),
    ("sync_overlap_steps", _int, (ENV_SYNC_OVERLAP_STEPS,)),
    ("sync_plan_ahead_steps", _int, (ENV_SYNC_PLAN_AHEAD_STEPS,)),
)


def timeouts_from_env(environ: Mapping[str, str]) -> dict[str, float]:
    """The runtime timeouts `environ` sets (TIMEOUT_ENV), by field name; ValueError naming a
    variable that is not a number of seconds."""
    return {name: _seconds(env, environ[env]) for name, env in TIMEOUT_ENV.items() if environ.get(env, "") != ""}


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidSettings(f"Invalid RuntimeSettings: environment variable {name}={text!r} is not a number.") \
            from None


def _flag(name: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise InvalidSettings(f"Invalid RuntimeSettings: environment variable {name}={text!r} must be 0 or 1.")
    return text == "1"


def _convert(name: str, text: str, conv: Callable[[str], object]) -> object:
    try:
        return conv(text)
    except ValueError as exc:
        if str(exc).startswith("Invalid RuntimeSettings"):
            raise
        raise InvalidSettings(f"Invalid RuntimeSettings: environment variable {name}={text!r} is not a number.") from None


def _coordinator_from_torchrun(env: Mapping[str, str]) -> str:
    """MASTER_ADDR:(MASTER_PORT + 1), or "" when this rank's environment has neither; with only
    one of them the error names the one missing here."""
    addr, port = env.get(TORCHRUN_MASTER_ADDR, ""), env.get(TORCHRUN_MASTER_PORT, "")
    if not addr and not port:
        return ""
    if not addr or not port:
        missing = TORCHRUN_MASTER_ADDR if not addr else TORCHRUN_MASTER_PORT
        raise InvalidSettings(f"Invalid RuntimeSettings: {missing} is not set on this rank (the coordinator address "
                         f"is derived from {TORCHRUN_MASTER_ADDR}:{TORCHRUN_MASTER_PORT}+{COORDINATOR_PORT_OFFSET}); "
                         f"set it, or {ENV_COORDINATOR_ADDRESS}.")
    if not port.isdigit() or not 0 < int(port) + COORDINATOR_PORT_OFFSET < 65536:
        raise InvalidSettings(f"Invalid RuntimeSettings: {TORCHRUN_MASTER_PORT}={port!r} is not a port below 65535.")
    return f"{addr}:{int(port) + COORDINATOR_PORT_OFFSET}"


def _is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 <= int(port) < 65536

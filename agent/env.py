"""What a trainer started by the agent finds in its environment, and the standby hand-over.

The agent sets these variables in every trainer's environment. They override any value of
the same name the agent itself inherited (the agent's assignment wins over the host's
environment), so a trainer can always trust them. torchrun's names are set too, so a script
written for torchrun (`init_process_group(init_method="env://")`) runs unchanged.

| variable                    | value                                                       |
|-----------------------------|-------------------------------------------------------------|
| FTHSDP_REPLICA_ID           | the replica this trainer belongs to                         |
| FTHSDP_RANK, RANK           | its rank inside the replica (0 = leader)                    |
| FTHSDP_WORLD_SIZE, WORLD_SIZE | ranks in the replica                                      |
| LOCAL_RANK                  | its index among the replica's ranks on this host (device)   |
| LOCAL_WORLD_SIZE            | how many ranks of the replica this host runs                |
| MASTER_ADDR, MASTER_PORT    | the torch.distributed rendezvous: the replica's rank-0 host |
|                             | (its registered pod IP), as the controller says             |
| FTHSDP_COORDINATOR_ADDRESS  | host:port where rank 0 hosts the replica's coordinator      |
| FTHSDP_REPLICA_VERSION      | the replica version (the controller's, of its last restart) |
|                             | it was started under; its hello carries it, so a coordinator |
|                             | of another restart of the replica refuses it (unset: 0)     |
| FTHSDP_CONTROLLER           | controller gRPC address(es), comma-separated, in HA order   |
| FTHSDP_HOST_ID              | the host (agent) that runs it                               |
| FTHSDP_JOB_ID               | the job                                                     |
| FTHSDP_STANDBY              | "1" for a pre-started standby trainer (no assignment yet)   |
| FTHSDP_TLS_*                | the agent's TLS files for the controller (`protos.dial`),   |
|                             | set only when the agent dials with TLS                      |
| FTHSDP_JOB_SECRET           | the job secret (hex) that authenticates the trainer ports   |
|                             | (`protos.job_secret`), when the agent has one               |
| FTHSDP_TRAINER_TOKEN        | with the job secret: this host's trainer token, the leader's |
|                             | credential toward the controller (`protos.credentials`)     |
| FTHSDP_INSECURE_TRAINER_PORTS | "1" when the agent runs with --insecure-trainer-ports     |
|                             | and no secret                                               |
| FTHSDP_TELEMETRY_FILE       | where the trainer keeps its collective telemetry ring       |
|                             | (`fthsdp.telemetry`), one file per slot; unset: no telemetry |

A trainer never inherits another way to the secret from the agent's own environment:
FTHSDP_JOB_SECRET_FILE is removed (the agent read it; its value is what the trainer gets), so
every trainer of one agent holds the secret the agent validated. The secret travels in the
environment only -- never on a command line, in a log line or in the hand-over below.

MASTER_* and the coordinator are set only when the controller named where the
replica meets (its rank-0 host registered an address), or when every rank of the replica runs
on this host (then they meet on 127.0.0.1, at the agent's own ports); otherwise whatever the
agent inherited stays.

A standby trainer starts with FTHSDP_STANDBY=1 and without any of the assignment's variables
(the replica, ranks and where it meets). It does its set-up (imports, model, data loader),
then calls `wait_for_assignment()`, which blocks on one JSON line on stdin, written by the
agent when an ASSIGN order arrives: the assignment's variables, by name, e.g.

    {"FTHSDP_REPLICA_ID": "r1", "FTHSDP_RANK": "0", "RANK": "0", "MASTER_ADDR": "10.0.0.7", ...}

and puts them into `os.environ` (and clears FTHSDP_STANDBY), so the rest of the trainer reads
its assignment the same way whether it started warm or cold: the variables are the same.
A reserve (the agent's `--warm-restarts`: a standby pre-started beside a running trainer, for
its slot's next restart) is started and handed over exactly so, with the slot's telemetry file.
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Mapping

from agent.policy import Placement
from protos import credentials, dial, job_secret
from protos.dial import TlsFiles
from protos.job_secret import JobSecret
from protos.telemetry_ring import ENV_FILE as TELEMETRY_FILE

REPLICA_ID = "FTHSDP_REPLICA_ID"
RANK = "FTHSDP_RANK"
WORLD_SIZE = "FTHSDP_WORLD_SIZE"
COORDINATOR_ADDRESS = "FTHSDP_COORDINATOR_ADDRESS"
REPLICA_VERSION = "FTHSDP_REPLICA_VERSION"
CONTROLLER = dial.ENV_CONTROLLER  # "FTHSDP_CONTROLLER"
HOST_ID = "FTHSDP_HOST_ID"
JOB_ID = "FTHSDP_JOB_ID"
STANDBY = "FTHSDP_STANDBY"
JOB_SECRET = job_secret.ENV_JOB_SECRET
INSECURE_TRAINER_PORTS = job_secret.ENV_INSECURE_TRAINER_PORTS
#: what the agent decides for its trainers, whatever its own environment says
TRAINER_TOKEN = credentials.ENV_TRAINER_TOKEN
_REPLACED = (STANDBY, JOB_SECRET, job_secret.ENV_JOB_SECRET_FILE, INSECURE_TRAINER_PORTS, TELEMETRY_FILE,
             TRAINER_TOKEN)
# torchrun's
TORCH_RANK = "RANK"
TORCH_WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"

#: What an assignment sets (and a standby starts without).
ASSIGNMENT_VARIABLES = (REPLICA_ID, RANK, WORLD_SIZE, COORDINATOR_ADDRESS, TORCH_RANK,
                        TORCH_WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, REPLICA_VERSION)


def split_host_port(address: str) -> tuple[str, str]:
    """("10.0.0.7", "29500") from "10.0.0.7:29500"; an IPv6 host loses its brackets."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def assignment_environment(p: Placement, *, host_id: str, job_id: str, controller: str,
                           replica_version: int = 0) -> dict[str, str]:
    """The variables one placement gives its trainer (a cold start and a hand-over alike)."""
    env = {REPLICA_ID: p.replica_id, RANK: str(p.rank), WORLD_SIZE: str(p.world_size),
           TORCH_RANK: str(p.rank), TORCH_WORLD_SIZE: str(p.world_size), LOCAL_RANK: str(p.local_rank),
           LOCAL_WORLD_SIZE: str(p.local_world_size), HOST_ID: host_id, JOB_ID: job_id, CONTROLLER: controller}
    if replica_version:
        env[REPLICA_VERSION] = str(replica_version)
    if p.rendezvous:
        env[MASTER_ADDR], env[MASTER_PORT] = split_host_port(p.rendezvous)
    if p.coordinator:
        env[COORDINATOR_ADDRESS] = p.coordinator
    return env


def trainer_environment(
    base: Mapping[str, str],
    placement: Placement | None,
    *,
    host_id: str,
    job_id: str,
    controller: str,
    tls: TlsFiles | None = None,
    secret: JobSecret | None = None,
    insecure_trainer_ports: bool = False,
    telemetry_file: str = "",
    replica_version: int = 0,
    slot: int = 0,
) -> dict[str, str]:
    """The environment of one trainer: `base` plus our variables (ours win).

    `placement is None` builds a standby's environment: FTHSDP_STANDBY=1 and none of the
    assignment's variables, not even inherited ones, but LOCAL_RANK: its `slot` on the host
    (the device it builds on; the placement it is handed in that slot has that local rank).
    """
    drop = ASSIGNMENT_VARIABLES if placement is None else (REPLICA_ID, RANK, WORLD_SIZE)
    env = {k: v for k, v in base.items() if k not in drop and k not in _REPLACED}
    if secret is not None:
        env[JOB_SECRET] = secret.hex()
        env[TRAINER_TOKEN] = credentials.trainer_token(secret, host_id)
    elif insecure_trainer_ports:
        env[INSECURE_TRAINER_PORTS] = "1"
    env.update({HOST_ID: host_id, JOB_ID: job_id, CONTROLLER: controller})
    if telemetry_file:
        env[TELEMETRY_FILE] = telemetry_file
    if tls is not None and tls.enabled:
        for name, value in ((dial.ENV_TLS_CA_FILE, tls.ca_file),
                            (dial.ENV_TLS_CERT_FILE, tls.cert_file),
                            (dial.ENV_TLS_KEY_FILE, tls.key_file),
                            (dial.ENV_TLS_SERVER_NAME, tls.server_name)):
            if value:
                env[name] = value
    if placement is None:
        env[STANDBY] = "1"
        env[LOCAL_RANK] = str(slot)
    else:
        env.update(assignment_environment(placement, host_id=host_id, job_id=job_id, controller=controller,
                                          replica_version=replica_version))
    return env


def handover_line(placement: Placement, *, host_id: str, job_id: str, controller: str,
                  replica_version: int = 0) -> bytes:
    """The one JSON line the agent writes to a standby trainer's stdin."""
    values = assignment_environment(placement, host_id=host_id, job_id=job_id, controller=controller,
                                    replica_version=replica_version)
    return (json.dumps(values, sort_keys=True) + "\n").encode()


def is_standby(environ: Mapping[str, str] | None = None) -> bool:
    """Trainer side: this process was pre-started as a standby (FTHSDP_STANDBY=1)."""
    return (os.environ if environ is None else environ).get(STANDBY) == "1"


def wait_for_assignment(stream: IO[str] | None = None) -> dict[str, str]:
    """Trainer side: block until the agent hands this standby its assignment.

    Returns the variables (name -> value) and sets them in `os.environ`. Raises EOFError when
    stdin closes without a line (the agent stopped the standby or died), ValueError for a line
    that is not the agent's.
    """
    line = (stream or sys.stdin).readline()
    if not line.strip():
        raise EOFError("stdin closed before the agent sent an assignment")
    values = json.loads(line)
    if not isinstance(values, dict) or REPLICA_ID not in values:
        raise ValueError(f"the hand-over line names no {REPLICA_ID}: {line[:200]!r}")
    known = set(ASSIGNMENT_VARIABLES) | {HOST_ID, JOB_ID, CONTROLLER}
    out = {k: str(v) for k, v in values.items() if k in known}
    os.environ.update(out)
    os.environ.pop(STANDBY, None)
    return out

"""What a trainer started by the agent finds in its environment, and the standby hand-over.

The agent sets these variables in every trainer's environment. They override any value of
the same name the agent itself inherited (the agent's assignment wins over the host's
environment), so a trainer can always trust them.

| variable            | value                                                       |
|---------------------|-------------------------------------------------------------|
| FTHSDP_REPLICA_ID   | the replica this trainer belongs to                         |
| FTHSDP_RANK         | its rank inside the replica (0 = leader)                    |
| FTHSDP_WORLD_SIZE   | ranks in the replica                                        |
| FTHSDP_CONTROLLER   | controller gRPC address(es), comma-separated, in HA order   |
| FTHSDP_HOST_ID      | the host (agent) that runs it                               |
| FTHSDP_JOB_ID       | the job                                                     |
| FTHSDP_STANDBY      | "1" for a pre-started standby trainer (no assignment yet)   |
| FTHSDP_TLS_*        | the agent's TLS files for the controller (`protos.dial`),   |
|                     | set only when the agent dials with TLS                      |
| FTHSDP_JOB_SECRET   | the job secret (hex) that authenticates the trainer ports   |
|                     | (`protos.job_secret`), when the agent has one               |
| FTHSDP_INSECURE_TRAINER_PORTS | "1" when the agent runs with                       |
|                     | --insecure-trainer-ports and no secret                      |
| FTHSDP_TELEMETRY_FILE | where the trainer keeps its collective telemetry ring     |
|                     | (`fthsdp.telemetry`), one file per slot; unset: no telemetry |

A trainer never inherits another way to the secret from the agent's own environment:
FTHSDP_JOB_SECRET_FILE is removed (the agent read it; its value is what the trainer gets), so
every trainer of one agent holds the secret the agent validated. The secret travels in the
environment only -- never on a command line, in a log line or in the hand-over below.

A standby trainer starts with FTHSDP_STANDBY=1 and without the first three variables. It does
its set-up (imports, data loader, checkpointer), then calls `wait_for_assignment()`, which
blocks on one JSON line on stdin, written by the agent when an ASSIGN order arrives:

    {"replica_id": "r1", "rank": 0, "world_size": 2, "host_id": "h4", "job_id": "demo",
     "controller": "10.0.0.1:50051"}

and puts the values into `os.environ` under the names above (and clears FTHSDP_STANDBY), so
the rest of the trainer reads its assignment the same way whether it started warm or cold.
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Mapping

from protos import dial, job_secret
from protos.dial import TlsFiles
from protos.job_secret import JobSecret
from protos.telemetry_ring import ENV_FILE as TELEMETRY_FILE

REPLICA_ID = "FTHSDP_REPLICA_ID"
RANK = "FTHSDP_RANK"
WORLD_SIZE = "FTHSDP_WORLD_SIZE"
CONTROLLER = dial.ENV_CONTROLLER  # "FTHSDP_CONTROLLER"
HOST_ID = "FTHSDP_HOST_ID"
JOB_ID = "FTHSDP_JOB_ID"
STANDBY = "FTHSDP_STANDBY"
JOB_SECRET = job_secret.ENV_JOB_SECRET
INSECURE_TRAINER_PORTS = job_secret.ENV_INSECURE_TRAINER_PORTS
#: what the agent decides for its trainers, whatever its own environment says
_REPLACED = (REPLICA_ID, RANK, WORLD_SIZE, STANDBY, JOB_SECRET, job_secret.ENV_JOB_SECRET_FILE, INSECURE_TRAINER_PORTS,
             TELEMETRY_FILE)

# JSON key of the hand-over line -> environment variable it fills.
HANDOVER_KEYS: dict[str, str] = {
    "replica_id": REPLICA_ID,
    "rank": RANK,
    "world_size": WORLD_SIZE,
    "host_id": HOST_ID,
    "job_id": JOB_ID,
    "controller": CONTROLLER,
}


def trainer_environment(
    base: Mapping[str, str],
    *,
    host_id: str,
    job_id: str,
    controller: str,
    replica_id: str | None,
    rank: int | None,
    world_size: int | None,
    tls: TlsFiles | None = None,
    secret: JobSecret | None = None,
    insecure_trainer_ports: bool = False,
    telemetry_file: str = "",
) -> dict[str, str]:
    """The environment of one trainer: `base` plus our variables (ours win).

    `replica_id is None` builds a standby's environment: FTHSDP_STANDBY=1 and no assignment.
    """
    env = {k: v for k, v in base.items() if k not in _REPLACED}
    if secret is not None:
        env[JOB_SECRET] = secret.hex()
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
    if replica_id is None:
        env[STANDBY] = "1"
    else:
        env.update({REPLICA_ID: replica_id, RANK: str(rank), WORLD_SIZE: str(world_size)})
    return env


def handover_line(*, replica_id: str, rank: int, world_size: int, host_id: str, job_id: str,
                  controller: str) -> bytes:
    """The one JSON line the agent writes to a standby trainer's stdin."""
    values = {"replica_id": replica_id, "rank": rank, "world_size": world_size,
              "host_id": host_id, "job_id": job_id, "controller": controller}
    return (json.dumps(values, sort_keys=True) + "\n").encode()


def wait_for_assignment(stream: IO[str] | None = None) -> dict[str, str]:
    """Trainer side: block until the agent hands this standby its assignment.

    Returns the values as strings and sets them in `os.environ`. Raises EOFError when stdin
    closes without a line (the agent stopped the standby or died).
    """
    line = (stream or sys.stdin).readline()
    if not line.strip():
        raise EOFError("stdin closed before the agent sent an assignment")
    values = json.loads(line)
    out = {HANDOVER_KEYS[k]: str(v) for k, v in values.items() if k in HANDOVER_KEYS}
    os.environ.update(out)
    os.environ.pop(STANDBY, None)
    return out

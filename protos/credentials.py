"""What a caller of the controller shows to prove who it is, made from the job secret.

The controller, the agents and the trainers of one job hold the job secret
(`protos.job_secret`). Nobody sends it; each proof is an HMAC under a key derived from it for
one purpose, so a proof made for one use never passes for another:

- a **registration proof** (`RegisterAgentRequest.proof`): "UNIX_MS.HEX", the HMAC of the host
  id, the incarnation and the wall-clock time it was made (milliseconds since the epoch). The
  controller accepts it within `REGISTRATION_WINDOW_S` of its own clock, so a host id, DEAD or
  unknown, cannot be claimed without the secret, and a copied registration soon goes stale.
  After registering, an agent presents the random agent secret it was given (its order stream,
  acks, exit reports, heartbeats, telemetry), not a proof.
- a **leader credential** (`credential` on QuorumRequest, ReportStepRequest,
  ReportFailureRequest, ReportFinishedRequest and a replica's HeartbeatRequest):
  * "host:HEX", the trainer token of the host the leader runs on: the HMAC of the host id. An
    agent hands it to the trainers it starts (FTHSDP_TRAINER_TOKEN, `agent.env`); the
    controller accepts it only for the replica whose rank 0 that host holds.
  * "replica:HEX", the HMAC of the replica id: what a leader started without an agent
    (torchrun alone) makes from the job secret; it acts for that replica only.
  Leader credentials are static (the hot path checks one HMAC, no clock): like a bearer token,
  they are secrets on the wire, which TLS keeps from an eavesdropper.

This module sits beside the wire contract because the controller (which checks), the agent and
the trainer runtime (which make the proofs) may not import each other.
"""

from __future__ import annotations

import hashlib
import hmac

from protos.job_secret import JobSecret

ENV_TRAINER_TOKEN = "FTHSDP_TRAINER_TOKEN"
PURPOSE_REGISTRATION = "controller agent registration"
PURPOSE_TRAINER_TOKEN = "controller trainer token"
PURPOSE_REPLICA_LEADER = "controller replica leader"
HOST_KIND, REPLICA_KIND = "host", "replica"
#: How far a registration proof's time may be from the controller's clock (either way).
REGISTRATION_WINDOW_S = 300.0
#: The longest credential or proof accepted (a longer one is refused before any HMAC).
MAX_CHARS = 160


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def trainer_token(secret: JobSecret, host_id: str) -> str:
    """The token a host's trainers show (the value of FTHSDP_TRAINER_TOKEN)."""
    return _mac(secret.key(PURPOSE_TRAINER_TOKEN), host_id)


def replica_token(secret: JobSecret, replica_id: str) -> str:
    return _mac(secret.key(PURPOSE_REPLICA_LEADER), replica_id)


def host_credential(token: str) -> str:
    return f"{HOST_KIND}:{token}"


def replica_credential(secret: JobSecret, replica_id: str) -> str:
    return f"{REPLICA_KIND}:{replica_token(secret, replica_id)}"


def registration_proof(secret: JobSecret, host_id: str, incarnation: str, unix_s: float) -> str:
    ms = int(unix_s * 1000)
    return f"{ms}.{registration_mac(secret, host_id, incarnation, ms)}"


def registration_mac(secret: JobSecret, host_id: str, incarnation: str, unix_ms: int) -> str:
    return _mac(secret.key(PURPOSE_REGISTRATION), host_id, incarnation, str(unix_ms))


def split_credential(credential: str) -> tuple[str, str]:
    """(kind, token) of "kind:token"; ("", "") when it has no kind."""
    kind, sep, token = credential.partition(":")
    return (kind, token) if sep else ("", "")


__all__ = ["ENV_TRAINER_TOKEN", "MAX_CHARS", "REGISTRATION_WINDOW_S", "host_credential", "registration_mac",
           "registration_proof", "replica_credential", "replica_token", "split_credential", "trainer_token"]

"""Does a caller prove what it claims? The checks on registration proofs and
coordinator credentials (protos/credentials.py says how they are made). Pure: the time is an argument.

`Credentials(None)` is a controller started with `--insecure`: every check passes, and a
claimed name is believed (the attacks in tests/security then succeed). With a job secret:

| call                                    | must show                                               |
|-----------------------------------------|---------------------------------------------------------|
| RegisterAgent                           | a registration proof for its host id and incarnation    |
| Heartbeat for hosts, Orders, AckOrder,  | the agent secret that host's registration was given     |
| ReportTrainerExit, ReportTelemetry,     | (checked by HostRegistry.authenticate_agent)            |
| DeregisterAgent                         |                                                         |
| Quorum, QuorumStream, the quorum port,  | a coordinator credential: the trainer token of the host |
| ReportStep, ReportFailure,              | that holds the replica's rank 0, or the replica's own   |
| ReportFinished, Heartbeat for replicas  | token (a coordinator without an agent)                  |
"""

from __future__ import annotations

import hmac
import math

from controller.core.errors import PermissionDenied
from protos import credentials as wire
from protos.job_secret import JobSecret

#: Tokens kept per kind (ids are bounded, a stranger's too; past this the cache starts over).
CACHED = 4096
#: What a proof or credential made with another job secret means, said plainly.
SECRET_DIFFERS = "the job secret differs from the controller's"


class Credentials:
    def __init__(self, secret: JobSecret | None) -> None:
        self.secret = secret
        #: host id -> its trainer token, replica id -> its token (computed once each)
        self._hosts: dict[str, str] = {}
        self._replicas: dict[str, str] = {}

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def trainer_token(self, host_id: str) -> str:
        return _cached(self._hosts, host_id, lambda: wire.trainer_token(self.secret, host_id))

    def _replica_token(self, replica_id: str) -> str:
        return _cached(self._replicas, replica_id, lambda: wire.replica_token(self.secret, replica_id))

    def check_registration(self, host_id: str, incarnation: str, proof: str, now_unix_s: float) -> None:
        """PermissionDenied unless `proof` is a fresh registration proof for this host and
        incarnation."""
        if self.secret is None:
            return
        why = _registration_problem(self.secret, host_id, incarnation, proof, now_unix_s)
        if why:
            raise PermissionDenied(f"the registration of host {host_id[:64]!r} is refused: {why}. An agent proves "
                                   f"the job secret (fthsdp agent --job-secret-file) to register a host.")

    def check_coordinator(self, credential: str, replica_id: str, host_id: str, rank0_holder: str | None) -> None:
        """PermissionDenied unless `credential` lets its holder coordinate `replica_id`: the token of
        `host_id`, which must hold the replica's rank 0 (`rank0_holder`), or the replica's own."""
        if self.secret is None:
            return
        why = self._coordinator_problem(credential, replica_id, host_id, rank0_holder)
        if why:
            raise PermissionDenied(f"a coordinator of replica {replica_id[:64]!r} is refused: {why}. A coordinator shows its "
                                   f"agent's trainer token ({wire.ENV_TRAINER_TOKEN}) or, without an agent, "
                                   f"proves the job secret (FTHSDP_JOB_SECRET_FILE).")

    def _coordinator_problem(self, credential: str, replica_id: str, host_id: str, rank0_holder: str | None) -> str:
        if not credential:
            return "it shows no credential"
        if len(credential) > wire.MAX_CHARS:
            return f"its credential is {len(credential)} characters (at most {wire.MAX_CHARS})"
        kind, token = wire.split_credential(credential)
        if kind == wire.HOST_KIND:
            if not host_id or not hmac.compare_digest(token, self.trainer_token(host_id)):
                return f"its credential is not the trainer token of host {host_id[:64]!r}"
            if rank0_holder != host_id:
                return (f"host {host_id[:64]!r} does not hold rank 0 of replica {replica_id[:64]!r}"
                        + (f" (host {rank0_holder!r} does)" if rank0_holder else " (no host does)"))
            return ""
        if kind == wire.REPLICA_KIND:
            if not hmac.compare_digest(token, self._replica_token(replica_id)):
                return f"its credential is not that replica's token: {SECRET_DIFFERS}"
            return ""
        return f"its credential is of no known kind ({kind[:16]!r}; want {wire.HOST_KIND} or {wire.REPLICA_KIND})"


def _cached(cache: dict[str, str], key: str, make) -> str:
    """A token from `cache`, made on a miss; past CACHED entries the cache starts over."""
    token = cache.get(key)
    if token is None:
        if len(cache) >= CACHED:
            cache.clear()
        token = cache[key] = make()
    return token


def _registration_problem(secret: JobSecret, host_id: str, incarnation: str, proof: str, now_unix_s: float) -> str:
    if not proof:
        return "it carries no proof of the job secret"
    if len(proof) > wire.MAX_CHARS:
        return f"its proof is {len(proof)} characters (at most {wire.MAX_CHARS})"
    ms, _, mac = proof.partition(".")
    if not ms.isdigit() or len(ms) > 16:
        return "its proof does not start with the time it was made (milliseconds since the epoch)"
    age_s = now_unix_s - int(ms) / 1000
    if not math.isfinite(age_s) or abs(age_s) > wire.REGISTRATION_WINDOW_S:
        # the proof carries the agent's clock: a proof from the future is a clock ahead
        side = "ahead of" if age_s < 0 else "behind"
        return (f"its proof's time is {abs(age_s):.0f}s {side} this controller's clock, a clock skew past the "
                f"{wire.REGISTRATION_WINDOW_S:g}s allowed either way (or a replayed proof): synchronize the "
                f"host's clock (NTP) and register again")
    if not hmac.compare_digest(mac, wire.registration_mac(secret, host_id, incarnation, int(ms))):
        return f"its proof was made with another job secret: {SECRET_DIFFERS}"
    return ""


__all__ = ["Credentials"]

"""Who may act for a host: agent secrets and client-certificate bindings. Pure.

Agent secrets. At registration with a new incarnation the controller hands the agent a random
secret (made by the service, 256 bits) and keeps only its SHA-256: the secret is never shown in
the status API, logged or persisted. The agent presents it on its order stream, its order acks
and its trainer-exit reports; a caller that knows only the published incarnation is refused. A
salt-free fast hash is enough: the secret is random and long, not a password.

Certificate bindings (with mTLS). `CertBinding(rule)` says which certificate identities (SAN
DNS names, SAN URIs and the subject CN) may act as which host id:
    "exact"                        an identity equals the host id;
    "{host_id}.agents.example.com" an identity equals the pattern with the host id put in.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

HOST_ID_FIELD = "{host_id}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret_hash: str, presented: str) -> bool:
    """True when `presented` is the secret whose hash is kept (never for an empty one)."""
    if not secret_hash or not presented:
        return False
    return hmac.compare_digest(secret_hash, hash_secret(presented))


@dataclass(frozen=True)
class CertBinding:
    rule: str

    def validate(self) -> "CertBinding":
        if self.rule != "exact" and HOST_ID_FIELD not in self.rule:
            raise ValueError(f"a certificate binding is 'exact' or a pattern containing {HOST_ID_FIELD}, "
                             f"got {self.rule!r}.")
        return self

    def expected(self, host_id: str) -> str:
        return host_id if self.rule == "exact" else self.rule.replace(HOST_ID_FIELD, host_id)

    def problem(self, identities: tuple[str, ...], host_id: str) -> str | None:
        """Why a certificate with these identities may not act as `host_id`, or None."""
        want = self.expected(host_id)
        if want in identities:
            return None
        shown = ", ".join(repr(i) for i in identities[:8]) or "none"
        return (f"the client certificate (identities {shown}) may not act as host {host_id!r}: "
                f"the binding rule {self.rule!r} wants an identity {want!r}")

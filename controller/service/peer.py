"""Who is calling: the client certificate's identities, and fresh agent secrets.

The decisions (does this certificate may act as that host? does this secret match?) are pure,
in controller.core.identity; this module only reads the gRPC call's TLS facts.
"""

from __future__ import annotations

import secrets

#: Bytes of randomness in an agent secret (it travels as URL-safe base64).
AGENT_SECRET_BYTES = 32


def new_agent_secret() -> str:
    return secrets.token_urlsafe(AGENT_SECRET_BYTES)


def certificate_identities(context) -> tuple[str, ...]:
    """SAN DNS names, SAN URIs and the subject CN of the caller's verified client certificate
    (empty without mTLS)."""
    auth = context.auth_context() or {}
    names = list(auth.get("peer_dns", ())) + list(auth.get("peer_uri", ()))
    if not names:  # older gRPC cores list every SAN under one key
        names = list(auth.get("x509_subject_alternative_name", ()))
    names += list(auth.get("x509_common_name", ()))
    return tuple(dict.fromkeys(n.decode(errors="replace") for n in names))

"""The credential a replica's leader shows the controller (protos/credentials.py): its host's
trainer token when its agent handed it one (FTHSDP_TRAINER_TOKEN, on the host named by
FTHSDP_HOST_ID), else, started without an agent, the replica's token made from the job secret;
"" with neither (a controller run with --insecure takes that, any other refuses it)."""

from __future__ import annotations

import os
from typing import Mapping

from protos import credentials, job_secret
from protos.job_secret import JobSecret


def leader_credential(replica_id: str, host_id: str, secret: JobSecret | None = None,
                      environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    token = env.get(credentials.ENV_TRAINER_TOKEN, "")
    if token and host_id:
        return credentials.host_credential(token)
    if secret is None:
        secret = job_secret.from_env(env)
    return credentials.replica_credential(secret, replica_id) if secret is not None else ""

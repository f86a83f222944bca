"""What an agent shows the controller to prove it holds the job secret (protos/credentials.py),
and the token it hands its trainers."""

from __future__ import annotations

import time

from agent.settings import AgentSettings
from protos import credentials


def registration_proof(settings: AgentSettings, incarnation: str) -> str:
    """The proof for one registration, made now ("" without a job secret: a controller run with
    --insecure takes the registration without it, any other refuses it)."""
    if settings.job_secret is None:
        return ""
    return credentials.registration_proof(settings.job_secret, settings.host_id, incarnation, time.time())

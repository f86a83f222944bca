"""What an agent keeps on its host across its own restarts: the secret of its registration.

With `--state-dir DIR` the agent writes the secret the controller gave its registration to
DIR/agent-<host_id>.secret (mode 0600, replaced atomically) and reads it back when it starts.
A restarted agent process (a crash, an OOM kill, a container restart: an emptyDir volume
outlives those) presents it as RegisterAgentRequest.previous_secret and so takes its host over
at once, instead of waiting for the old incarnation's heartbeats to time out. Only that host's
agent can hold the secret; a clean stop (deregistration) deletes the file. Trainers run as the
same user and could read it; the file is not a defence against the host's own trainers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: Longer content is not a secret the controller gave (they are 43 characters).
MAX_SECRET_CHARS = 128


def path_for(state_dir: str, host_id: str) -> Path:
    return Path(state_dir) / f"agent-{host_id.replace('/', '_')}.secret"


def read_secret(path: Path) -> str:
    """The kept secret, or "" when there is none (or it cannot be read)."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        log.warning("cannot read the agent's kept secret %s: %s", path, exc)
        return ""
    return text if 0 < len(text) <= MAX_SECRET_CHARS and text.isprintable() else ""


def write_secret(path: Path, secret: str) -> None:
    """Keep `secret` (atomically, readable by this user only). Failures are logged: without
    the file a restarted agent waits for the heartbeat timeout instead."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot keep the agent's secret in %s: %s", path, exc)


def forget_secret(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot delete the agent's kept secret %s: %s", path, exc)

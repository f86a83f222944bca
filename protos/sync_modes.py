"""How replicas meet, as the controller and the trainer runtime both name it (one job setting).

"sync": every step (gradients averaged across replicas); "local_sgd" and "diloco": every
sync_every_steps inner steps (fthsdp/sync/outer.py). The controller states its mode in every
quorum answer; a trainer whose own mode differs refuses to train (`mismatch`).
"""

from __future__ import annotations

SYNC_MODES = ("sync", "local_sgd", "diloco")


def mismatch(controller_mode: str, controller_every: int, runtime_mode: str, runtime_every: int) -> str:
    """"" when they agree (or the controller states no mode: an older one); else why not, naming both."""
    if not controller_mode or (controller_mode, controller_every) == (runtime_mode, runtime_every):
        return ""
    return (f"the controller runs the job with --sync-mode {controller_mode} --sync-every {controller_every}, "
            f"this trainer with sync_mode {runtime_mode!r} sync_every_steps {runtime_every} (FTHSDP_SYNC_MODE, "
            f"FTHSDP_SYNC_EVERY_STEPS): every replica and the controller must use the same; fix one and restart")

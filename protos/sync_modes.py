"""How replicas meet, as the controller and the trainer runtime both name it (one job setting).

"sync": every step (gradients are averaged across replicas); "local_sgd" and "diloco": every
sync_every_steps inner steps (fthsdp/sync/outer.py); "streaming_diloco": the model in
sync_fragments fragments, one fragment's sync every sync_every_steps / sync_fragments inner
steps. The controller states its mode, H and F in every quorum answer; a trainer whose own
differ refuses to train (`mismatch`).
"""

from __future__ import annotations

SYNC_MODES = ("sync", "local_sgd", "diloco", "streaming_diloco")


def mismatch(controller_mode: str, controller_every: int, runtime_mode: str, runtime_every: int,
             controller_fragments: int = 0, runtime_fragments: int = 1) -> str:
    """"" when they agree (or the controller states no mode: an older one; a controller that
    states no fragments means one); else why not, naming both."""
    controller_fragments = controller_fragments or 1
    if not controller_mode or (controller_mode, controller_every, controller_fragments) == (
            runtime_mode, runtime_every, runtime_fragments):
        return ""
    return (f"the controller runs the job with --sync-mode {controller_mode} --sync-every {controller_every} "
            f"--sync-fragments {controller_fragments}, this trainer with sync_mode {runtime_mode!r} sync_every_steps "
            f"{runtime_every} sync_fragments {runtime_fragments} (FTHSDP_SYNC_MODE, FTHSDP_SYNC_EVERY_STEPS, "
            f"FTHSDP_SYNC_FRAGMENTS): every replica and the controller must use the same; fix one and restart")

"""How replicas meet, as the controller and the trainer runtime both name it (one job setting).

"sync": every step (gradients are averaged across replicas); "local_sgd" and "diloco": every
sync_every_steps inner steps (fthsdp/sync/outer.py); "streaming_diloco": the model in
sync_fragments fragments, one fragment's sync every sync_every_steps / sync_fragments inner
steps. The controller states its mode, H and F in every quorum answer; a trainer whose own
differ refuses to train (`mismatch`).
"""

from __future__ import annotations

SYNC_MODES = ("sync", "local_sgd", "diloco", "streaming_diloco")


def schedule_problems(mode: object, every: object, fragments: object) -> list[str]:
    """What is wrong with a mode, H (sync_every_steps) and F (sync_fragments), each naming the bad
    value; [] when they fit: a known mode, H = 1 in "sync" and >= 1 otherwise, F = 1 but in
    "streaming_diloco", where it divides H. The controller's and the runtime's settings both ask."""
    if mode not in SYNC_MODES:
        return [f"sync_mode must be one of {', '.join(SYNC_MODES)}, got {mode!r}."]
    problems = []
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        problems.append(f"sync_every_steps must be a number of inner steps >= 1, got {every!r}.")
    elif mode == "sync" and every != 1:
        problems.append(f"sync_every_steps={every} needs sync_mode local_sgd, diloco or streaming_diloco "
                        f"(sync_mode 'sync' meets every step).")
    if not isinstance(fragments, int) or isinstance(fragments, bool) or fragments < 1:
        problems.append(f"sync_fragments must be a number of fragments >= 1, got {fragments!r}.")
    elif fragments > 1 and mode != "streaming_diloco":
        problems.append(f"sync_fragments={fragments} needs sync_mode streaming_diloco (got {mode!r}).")
    elif isinstance(every, int) and every % fragments:
        problems.append(f"sync_every_steps={every} must be a multiple of sync_fragments={fragments} (each fragment "
                        f"syncs once per sync_every_steps inner steps, one every sync_every_steps / sync_fragments).")
    return problems


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

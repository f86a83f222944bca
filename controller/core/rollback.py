"""Rollback is a last resort: when may a round go back in history, and from where? Pure.

The job's *history* is the sequence of committed steps that the current quorums continue;
`history_step` is its newest committed step. A round whose members all ask for a step at or
below it would train steps the job already committed: a rollback. Before accepting one,
`check_rollback` waits (up to `wait_s`, counted from when the round first wanted to close)
for the replicas that hold the newest step to come back: a replica that was only paused, or
cut off for a while, still has that state, and with it nothing is lost. When none returns,
the rollback goes ahead, from the newest durable checkpoint when it is newer than what the
members hold.

Rules, first match wins:
  1. Some member asks for a step past `history_step`: no rollback.
  2. A replica that holds the newest step may still come back, and the wait is not over: wait.
     A holder that is alive (it heartbeats) is waited for as long as it shows signs of life,
     beyond `wait_s`: until its heartbeat timeout has passed since its last beat. A slow but
     live replica is never rolled back past.
  3. Otherwise: roll back, to the newest checkpoint if it is newer than the members' state.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RollbackDecision:
    #: True: the round must not close yet (look again at `wake_at`).
    wait: bool
    reason: str
    wake_at: float | None = None
    #: Set when the members should load the checkpoint of this step instead of training on
    #: from their own (older) state.
    resume_checkpoint_step: int | None = None
    #: Committed steps the job gives up: history_step minus the step it keeps.
    steps_lost: int = 0


def _names(ids) -> str:
    return ", ".join(sorted(ids))


def check_rollback(members: dict[str, int], *, history_step: int, holders: dict[str, int],
                   newest_checkpoint_step: int, waiting_since: float | None, now: float,
                   wait_s: float, alive_until: dict[str, float] | None = None) -> RollbackDecision | None:
    """`members`: replica -> the step it asks to train; `holders`: replicas outside the
    round that committed `history_step` (dead or late), with that step; `alive_until`: for
    the holders that are not dead, until when they count as alive (their last heartbeat plus
    the heartbeat timeout). None: no rollback."""
    resume_step = max(members.values())
    # 1. Someone continues the history: nothing goes back.
    if resume_step > history_step:
        return None
    # 2. The newest state may come back with a replica that holds it.
    since = now if waiting_since is None else waiting_since
    alive = {rid: t for rid, t in (alive_until or {}).items() if rid in holders and now < t}
    if holders and (now < since + wait_s or alive):
        until = max([since + wait_s, *alive.values()])
        live = f" ({_names(alive)} still heartbeat{'s' if len(alive) == 1 else ''})" if alive else ""
        return RollbackDecision(
            True, f"waiting up to {until - now:.3g}s more for {_names(holders)} (which committed step "
                  f"{history_step}){live} before rolling back to step {resume_step}", wake_at=until)
    # 3. Roll back: from the newest durable checkpoint when the members hold less than it.
    why = (f"{_names(holders)} did not come back within {wait_s:g}s" if holders
           else "no replica that committed it is left")
    reason = (f"ROLLBACK: the job had committed step {history_step}, but no member holds it ({why}), "
              f"so training resumes at step {resume_step}")
    if newest_checkpoint_step >= resume_step:
        reason = (f"ROLLBACK: the job had committed step {history_step}, but no member holds it ({why}); "
                  f"the members resume from the checkpoint of step {newest_checkpoint_step}")
        return RollbackDecision(False, reason, resume_checkpoint_step=newest_checkpoint_step,
                                steps_lost=history_step - newest_checkpoint_step)
    return RollbackDecision(False, reason, steps_lost=history_step - (resume_step - 1))

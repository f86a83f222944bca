"""The kinds of events the controller records, each with its level and meaning.

Every decision that changes the cluster becomes one `Event` (controller/core/model.py): kept
in the status API's bounded ring, persisted with the journal (so a new leader keeps them) and
written by the service as one JSON line. docs/operations.md lists the same table for
operators. A kind not in the table (a newer one) is logged at "info".
"""

from __future__ import annotations

LEVELS = ("info", "warning", "error")

#: kind -> (level, what it means)
KINDS: dict[str, tuple[str, str]] = {
    "replica": ("info", "a replica registered, or changed state (JOINING, HEALTHY, BEHIND) with a reason"),
    "finished": ("info", "a replica trained all its steps and its trainer exited cleanly"),
    "job": ("info", "the job COMPLETED: every replica finished or is dead"),
    "job_stuck": ("warning", "no replica can make progress (all DEAD, waiting on hosts that cannot run, no free "
                             "spare): the job FAILS after fail_after_s unless one can train again"),
    "job_failed": ("error", "the job FAILED: no replica could make progress for fail_after_s; final"),
    "suspect": ("warning", "a replica's coordinator connection closed without goodbye: rounds stop waiting for it until "
                           "it joins again or a heartbeat proves it alive"),
    "death": ("warning", "a replica became DEAD; `cause` says how it was detected"),
    "quorum": ("info", "a new quorum formed: its members, max step, lr scale and the reason it closed"),
    "rollback": ("error", "a quorum's members all lack the newest committed step: training goes back"),
    "rollback_wait": ("warning", "no live replica holds the newest committed step: the round waits (bounded) "
                                 "for a replica that does"),
    "roll_forward": ("warning", "a replica came back with newer state than a rollback's: the job rolls forward "
                                "to it, abandoning the steps committed since the rollback"),
    "commit_failed": ("warning", "a replica's two-phase commit failed; the next quorum gets a new id"),
    "host": ("info", "an agent registered, registered again (or took over its host after a restart), returned "
                     "after repair, or was uncordoned; an exit of a trainer already replaced"),
    "host_death": ("warning", "an agent fell silent past the heartbeat timeout"),
    "host_left": ("warning", "an agent stopped cleanly and deregistered: its work moves to a spare"),
    "replica_restart": ("warning", "a trainer died: every host of its replica restarts its ranks together"),
    "cordon": ("warning", "a host was cordoned (by an operator, or after a failure)"),
    "swap": ("warning", "a spare took a failed or drained host's assignment"),
    "no_spare": ("error", "a host's work has no spare to move to: its replica stays out"),
    "order": ("info", "orders were queued for agents (assign, stop, restart)"),
    "order_failed": ("error", "an agent refused an order"),
    "grace": ("info", "a new leader forgives silence while clients reconnect after the takeover"),
    "leader": ("info", "this controller became the leader (warning when it took over a running job)"),
    "digest_mismatch": ("error", "replicas that committed the same step hold different state: the minority "
                                 "becomes DIVERGED and re-syncs from the majority"),
    "no_checkpoint": ("warning", "the job's replicas write no durable checkpoint (said once, when the first one "
                                 "joins): a failure of every replica restarts from step 0"),
    "diagnosis": ("warning", "the diagnosis found a hang, a straggler or silent data corruption: the suspect "
                             "host, the gist of the evidence and what was done (evict, dry_run, hold, report)"),
}


def level_of(kind: str) -> str:
    return KINDS.get(kind, ("info", ""))[0]

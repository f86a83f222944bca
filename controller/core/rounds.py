"""Rounds: the open round, the quorums it forms and the job's history. A component. Time passed in.

    open round --(joins; compute_quorum says close)--> quorum formed --(answers out)--> next round
    a quorum below the history's newest step rolls it back (controller.core.rollback); a member
    that brings a step past it (back from an older history) rolls it forward

It owns the round (who joined, when, why it waits), the current quorum and the recent ones, and
the history (its newest committed step, its number, the rollbacks' steps lost). It reads the
replica records it is handed and changes none of them: seating the members in their new states
is the replica registry's (ControllerState combines the two in `try_close_round`). What it needs
of the rest comes in at construction: the pending writes, `announce` (an event) and the goodput
tracker it reports joins, quorums and abandoned steps to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Callable

from controller.core.checks import clip_text
from controller.core.model import Quorum, Replica, ReplicaState
from controller.core.pending_writes import REPLICAS, PendingWrites
from controller.core.admission import step_problem
from controller.core.quorum import RoundView, compute_quorum, form_quorum, quorate_since
from controller.core.quorum_codec import quorum_from_dict
from controller.core.rollback import RollbackDecision, check_rollback
from controller.settings import ControllerSettings

#: What `decide` hands `form`: the members (replica id -> step), the rollback (None: none), the reason.
Decided = tuple[dict[str, int], RollbackDecision | None, str]


class Rounds:
    """`announce(now, kind, subject, message, cause="")` records an event."""

    def __init__(self, settings: ControllerSettings, writes: PendingWrites, announce: Callable[..., None],
                 goodput) -> None:
        self.settings = settings
        self._writes, self._announce, self._goodput = writes, announce, goodput
        self.quorum: Quorum | None = None
        #: Quorum ids count up from here. A controller that starts with an empty store starts
        #: from its clock (ms), so trainers that outlive it never see a quorum id go back.
        self.first_quorum_id = 1
        self.quorum_history: list[Quorum] = []
        self.round_joined: dict[str, int] = {}
        #: joiners this round with a new process or new addresses: the quorum id must change
        self.round_renewed: set[str] = set()
        self.round_first_join_at: float | None = None
        #: (the round's first join time, when it first had a majority): see quorum.quorate_since
        self.round_quorate: tuple[float | None, float] | None = None
        self.round_reason = "no replica has joined this round"
        self.round_wake_at: float | None = None
        self.steps_committed = 0
        #: the highest step any replica ever committed
        self.max_committed_step = -1
        #: the job's current history (see controller.core.rollback): its newest committed
        #: step, its number (bumped by every rollback and roll-forward), the step its latest
        #: rollback resumed at (-1: none), and the newest durable checkpoint coordinators reported
        self.history_step = -1
        self.history_epoch = 0
        self.branch_start_step = -1
        self.newest_checkpoint_step = -1
        #: committed steps given up: "rollback" (gone back past them), "abandoned" (trained on
        #: a history that a returning replica's newer state replaced)
        self.steps_lost: dict[str, int] = {}
        #: how often the history changed: "rollback", "roll_forward"
        self.history_changes: dict[str, int] = {}
        #: since when a round has been waiting before a rollback (not durable: a new leader waits anew)
        self.rollback_wait_since: float | None = None

    # -- the open round ----------------------------------------------------------------------

    def beyond_history(self, replica_id: str, step: int) -> str | None:
        """Why a join at `step` asks for more than the job's history allows (admission.step_problem), or None."""
        member = self.quorum is not None and any(m.replica_id == replica_id for m in self.quorum.members)
        return step_problem(replica_id, step, self.quorum.max_step if self.quorum else None,
                            self.max_committed_step, member)

    def joined(self, replica_id: str, step: int, renewed: bool, now: float) -> None:
        """`replica_id` joined the open round to train `step`; `renewed`: with a new process or
        new addresses (the quorum id must change)."""
        if renewed:
            self.round_renewed.add(replica_id)
        if not self.round_joined:
            self.round_first_join_at = now
        self.round_joined[replica_id] = step
        self._goodput.on_join(replica_id, now)

    def leave(self, replica_id: str) -> bool:
        """`replica_id` is no longer in the open round (it left, finished or died). Returns whether it was."""
        if self.round_joined.pop(replica_id, None) is None:
            return False
        if not self.round_joined:
            self.round_first_join_at = None
        return True

    def end(self, reason: str) -> None:
        """No round closes any more (the job ended), for `reason`: the joins waiting in it leave
        (the shell refuses them at once, saying how the job ended)."""
        self.round_reason, self.round_wake_at = reason, None
        self.round_joined.clear()
        self.round_first_join_at = None

    def decide(self, replicas: Mapping[str, Replica], live: frozenset[str], dead: frozenset[str],
               suspect: frozenset[str], now: float) -> Decided | None:
        """The quorum policy and the rollback rule on the open round: the members (with their
        steps), the rollback (None: none) and the reason; None while the round stays open."""
        s = self.settings
        view = RoundView(
            joined=dict(self.round_joined),
            first_join_at=self.round_first_join_at,
            live=live,
            previous=self.quorum.member_ids if self.quorum else frozenset(),
            unregistered=max(s.replicas - len(replicas), 0),
            dead=dead,
            suspect=suspect,
            # if the round is quorate now and was not before, it became so now
            quorate_at=_or(quorate_since(self.round_quorate, self.round_first_join_at), now),
        )
        decision = compute_quorum(view, now, min_replicas=s.min_replicas, join_timeout_s=s.join_timeout_s)
        if decision.quorate and quorate_since(self.round_quorate, self.round_first_join_at) is None:
            self.round_quorate = (self.round_first_join_at, now)  # this round's, by its first join
        self.round_reason, self.round_wake_at = decision.reason, decision.wake_at
        if decision.members is None:
            return None
        members = {rid: self.round_joined[rid] for rid in decision.members}
        holders = {r.replica_id: r.committed_step for r in replicas.values()
                   if r.replica_id not in members and r.committed_step >= self.history_step
                   and r.state != ReplicaState.FINISHED}  # a finished replica does not come back
        rollback = check_rollback(members, history_step=self.history_step, holders=holders,
                                  newest_checkpoint_step=self.newest_checkpoint_step,
                                  waiting_since=self.rollback_wait_since, now=now, wait_s=s.rollback_wait_s,
                                  alive_until={rid: replicas[rid].last_seen + s.heartbeat_timeout_s
                                               for rid in holders if replicas[rid].state != ReplicaState.DEAD})
        if rollback is not None and rollback.wait:
            if self.rollback_wait_since is None:
                self._announce(now, "rollback_wait", "round", rollback.reason)
                self.rollback_wait_since = now
            self.round_reason, self.round_wake_at = rollback.reason, rollback.wake_at
            return None
        self.rollback_wait_since = None
        reason = clip_text(decision.reason + (f"; {rollback.reason}" if rollback else ""), s.max_reason_chars)
        return members, rollback, reason

    # -- forming the quorum ------------------------------------------------------------------

    def form(self, decided: Decided, replicas: Mapping[str, Replica], diverged: frozenset[str],
             now: float) -> Quorum:
        """The quorum of the members `decide` chose, and the history it starts or continues.
        The caller seats the members (the replica registry), then hands it to `adopt`."""
        s = self.settings
        members, rollback, reason = decided
        self._goodput.on_quorum(members, now)
        q = form_quorum(
            members,
            previous_id=self.quorum.quorum_id if self.quorum else self.first_quorum_id - 1,
            previous_members=self.quorum.member_ids if self.quorum else frozenset(),
            # a failed commit, or a member with a new process or new addresses, needs new rings
            failed_commit=any(replicas[rid].failed_commit or rid in self.round_renewed for rid in members),
            must_resync=diverged,
            lr_policy=s.lr_policy,
            total_replicas=s.replicas,
            reason=reason,
            now=now,
        )
        if rollback is not None:
            q = replace(q, resume_checkpoint_step=rollback.resume_checkpoint_step)
        self._switch_history(q, rollback, replicas, now)
        return q

    def adopt(self, q: Quorum, now: float) -> None:
        """`q` is the current quorum (its members seated); the next round opens."""
        if not self.quorum or q.quorum_id != self.quorum.quorum_id:
            self._announce(now, "quorum", str(q.quorum_id),
                           f"quorum {q.quorum_id}: {', '.join(m.replica_id for m in q.members)} at step "
                           f"{q.max_step}, lr_scale {q.lr_scale:.3f} ({q.reason})")
            self.quorum_history.append(q)
            del self.quorum_history[: -self.settings.recent_quorums]
            self._writes.mark(REPLICAS)
        self.quorum = q
        self.round_joined = {}
        self.round_renewed = set()
        self.round_first_join_at = None
        self.round_wake_at = None

    def _switch_history(self, q: Quorum, rollback: RollbackDecision | None, replicas: Mapping[str, Replica],
                        now: float) -> None:
        """A rollback starts a new history below the newest committed step; a member that
        brings a step past the history's newest (a replica back from an older history) rolls
        it forward, abandoning what was committed since the rollback. Both are loud: an event
        with both steps, and the steps counted in `steps_lost`."""
        newest = q.max_step - 1
        on_branch = [rid for rid, r in replicas.items() if r.history_epoch == self.history_epoch]
        if rollback is not None:
            # The history continues from what the members hold; if they load the offered
            # checkpoint instead, their first report moves it up to there.
            self._lose("rollback", rollback.steps_lost)
            self._announce(now, "rollback", str(q.quorum_id),
                           f"quorum {q.quorum_id} rolls back: the job had committed step {self.history_step}, "
                           f"training resumes at step {q.max_step} ({rollback.steps_lost} committed steps lost"
                           + (f"; from the checkpoint of step {q.resume_checkpoint_step}"
                              if q.resume_checkpoint_step is not None else "") + ")", "rollback")
            self._goodput.on_abandoned(on_branch, q.max_step)  # what they committed past it
            self.history_step, self.branch_start_step = newest, q.max_step
            kind = "rollback"
        elif newest > self.history_step and any(
                replicas[m.replica_id].history_epoch != self.history_epoch for m in q.members if m.healthy):
            abandoned = max(self.history_step - self.branch_start_step + 1, 0) if self.branch_start_step >= 0 else 0
            back = sorted(m.replica_id for m in q.members if m.healthy)
            self._lose("abandoned", abandoned)
            if self.branch_start_step >= 0:  # the branch since the rollback, as its committers trained it
                self._goodput.on_abandoned(on_branch, self.branch_start_step)
            self._announce(now, "roll_forward", str(q.quorum_id),
                           f"quorum {q.quorum_id} rolls forward from step {self.history_step} to step {newest}: "
                           f"{', '.join(back)} came back with it; {abandoned} steps committed since the rollback "
                           f"are abandoned", "roll_forward")
            self.history_step, self.branch_start_step = newest, -1
            kind = "roll_forward"
        else:
            return
        self.history_changes[kind] = self.history_changes.get(kind, 0) + 1
        self.history_epoch += 1
        self._writes.mark(REPLICAS)

    def _lose(self, kind: str, steps: int) -> None:
        self.steps_lost[kind] = self.steps_lost.get(kind, 0) + max(steps, 0)

    # -- commits -----------------------------------------------------------------------------

    def committed(self, step: int, history_epoch: int, checkpoint_step: int | None) -> None:
        """A replica that trained on history `history_epoch` committed `step` (a commit on an
        older history extends nothing); `checkpoint_step`: its newest durable checkpoint."""
        self.steps_committed += 1
        self.max_committed_step = max(self.max_committed_step, step)
        if history_epoch == self.history_epoch:
            self.history_step = max(self.history_step, step)
            if checkpoint_step is not None:
                self.newest_checkpoint_step = max(self.newest_checkpoint_step, checkpoint_step)

    def finished_at(self, step: int) -> None:
        """A replica finished at `step`, whose commit report was lost: the step is the job's."""
        self.max_committed_step = max(self.max_committed_step, step)

    # -- durable snapshot --------------------------------------------------------------------

    def restore(self, replicas: dict | None, journal: dict | None, now: float) -> None:
        """What a previous leader wrote (the replicas section and the journal)."""
        if not replicas:
            # An empty store: count quorum ids up from the clock (ms), so clients that outlive
            # a controller without a durable store never see them go back.
            self.first_quorum_id = max(int(now * 1000), 1)
        else:
            self.first_quorum_id = replicas.get("first_quorum_id", 1)
            self.quorum = quorum_from_dict(replicas["quorum"]) if replicas["quorum"] else None
            self.steps_committed = replicas["steps_committed"]
            self.max_committed_step = replicas.get("max_committed_step", -1)
            (self.history_step, self.history_epoch, self.branch_start_step,
             self.newest_checkpoint_step) = replicas.get("history", [self.max_committed_step, 0, -1, -1])
            self.steps_lost = dict(replicas.get("steps_lost", {}))
            self.history_changes = dict(replicas.get("history_changes", {}))
        if journal:
            self.quorum_history = [quorum_from_dict(q) for q in journal["history"]]


def _or(value: float | None, default: float) -> float:
    return default if value is None else value

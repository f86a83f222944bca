"""One rank's side of the replica step, as a pure protocol: states, events, effects, `advance`.

    advance(state, event, now) -> (state, effects)      (state.settings: this rank's RuntimeSettings)

No I/O, no clock, no threads. The Manager feeds events -- what the training script called,
what the coordinator said, what the background catch-up fetch reported, time passing -- and
executes the returned effects in order. The rank never decides a step alone: it votes, and
applies the one decision the coordinator sends for that attempt.

          Begin                 PlanArrived                 End (and the fetch done)
    IDLE ─────────▶ PLANNING ─────────────▶ TRAINING ──────────────────────────▶ VOTING
     ▲                │  │                    │  Reduced, FetchFinished, Tick    │
     │                │  │ PlanRefused:       │  (a failure makes the vote no)   │ DecisionArrived:
     │                │  │  retry → IDLE      │                                  │  commit → IDLE, step + 1
     │                │  │  finished → ENDED  │  a retry decided before this     │  retry  → IDLE
     │                │  │  fatal → FAILED    │  rank voted → IDLE               │
     └────────────────┴──┴────────────────────┴──────────────────────────────────┘
                             (a retry counts; more than max_retries in a row → FAILED)

    PLANNING ── ResumeOrdered ──▶ RESUMING ── CheckpointLoaded ──▶ IDLE at the checkpoint's step
               (a rollback quorum: the durable checkpoint is newer than the replica's state)

    Begin at max_steps → ENDED ── Close ──▶ FINISHING ── FinishedArrived, or its deadline,
                                              ▲           or the coordinator gone ──▶ FINISHED
                                              └── Close from IDLE, PLANNING, TRAINING, VOTING
    FAILED ◀── no plan, or no decision after voting, within its bound (a rank that voted yes
               is in doubt: it never guesses); the coordinator gone; a fatal refusal

Semi-synchronous replicas (settings.sync_mode local_sgd, diloco or streaming_diloco, H =
sync_every_steps, F = sync_fragments, 1 but in streaming_diloco): a step is one *sync* (of one
fragment in streaming), and K = H / F inner steps on the replica's own group come before it.
`inner` counts them; they never reach the coordinator. The sync of step s carries fragment
f(s) = (s + 1) mod F (settings.fragment_at): fragment f is due when the inner steps trained are
≡ f·K (mod H), so each fragment syncs once per H inner steps, staggered:

          Begin (inner < K): BeginInner          End: InnerStep (+ TakePseudoGradient(f(step)) at the K-th)
    IDLE ───────────────────────────────▶ INNER ─────────────────────────────────────▶ IDLE, inner + 1
    IDLE ── Begin (inner = K) ──▶ PLANNING ── PlanArrived: ReducePseudoGradient(f(plan.step)) ──▶ SYNCING
    SYNCING ── Reduced (and the fetch done) ──▶ VOTING ── commit: ApplyOuterStep(f(plan.step)) ──▶ IDLE, step + 1, inner 0
                                                          retry ──▶ IDLE, inner = K (the same pseudo-gradient)

Overlapped (streaming_diloco, tau = settings.overlap_steps >= 1): the sync is *prepared*
tau inner steps before it is due and runs *in flight* (state.flight) while the trainer trains
inner steps K - tau ... K - 1; between them (phase IDLE) and during them (INNER) `_FLIGHT_TABLE`
takes the sync's events before the phase's table does. The Manager feeds them as they come, not
only between inner steps: its flight waker (fthsdp/step/flight_waker.py) applies, while the
trainer computes, the transitions that only move the flight on (plan -> ConfigureRing and
StartReduce, Reduced -> SendVote, a commit held); one that ends the flight or leaves the phase
(a retry, a refusal, a failure) it holds for the trainer's next call, which feeds it in IDLE:

    End (inner -> K - tau): InnerStep, TakePseudoGradient(f, keep_local: the fragment trains on)
    IDLE ── Begin (inner = K - tau): SendBegin (no ServeState: the state moves), BeginInner ──▶ INNER
                                      flight NONE ──▶ PLANNING
    flight PLANNING ── PlanArrived: ConfigureRing (serving nobody), StartReduce(f) ──▶ REDUCING
                    ── a plan with a catch-up (a member behind, fetchers, this replica behind),
                       or none: SendVote(no), out of the ring ──▶ VOTING (a catch-up: deferred,
                       not counted)
    flight REDUCING ── Reduced: SendVote ──▶ VOTING ── DecisionArrived commit ──▶ COMMITTED (held)
    the due step, Begin at inner = K:  COMMITTED: the commit (GatherReduced, ApplyOuterStep(f), ...)
        PLANNING ──▶ PLANNING,  REDUCING ──▶ SYNCING (AwaitReduce),  VOTING ──▶ VOTING
        (the rest of the sync is a blocking one, its deadlines running on)
    a retry in flight (DropReduce) ──▶ flight NONE, inner steps on to K, then the blocking sync
        with the same pseudo-gradient; Close, CoordinatorLost, deadlines: as in PLANNING/VOTING

Planned ahead (no overlap, P = settings.sync_plan_ahead_steps >= 1; 0 by default): only the
quorum goes ahead; the pseudo-gradient is still the K-th step's.

    IDLE ── Begin (inner = K - P): SendBegin (no ServeState), BeginInner ──▶ INNER, flight PLANNING
    flight PLANNING ── PlanArrived: ConfigureRing (serving nobody) ──▶ PLANNED (held)
                    ── a plan with a catch-up, or none: as above (deferred to the due step)
    flight PLANNED ── a newer plan, a refusal, a decision: a retry (nothing to drop) ──▶ flight NONE
    the due step, Begin at inner = K:  PLANNED: ReducePseudoGradient(f) ──▶ SYNCING (as blocking)
        PLANNING ──▶ PLANNING (its begin sent: nothing sent again; its deadline runs on)

The commit advances the ledger by K for every contributor: the batches of the inner steps
since its last committed sync enter the committed history with the next sync that commits
with it as a contributor, whichever fragment that sync carries (each inner step is counted
by exactly one sync: the first to commit after it). A behind replica adopts its source's
state and ledger there, its own inner steps thrown away; a checkpoint loaded on a rollback
sets inner to 0. The schedule position is the step itself (f(step), inner 0 at every step
start), so catch-up and checkpoints carry it with the step.

A behind replica (its member is not healthy: a late joiner, a restarted or a DIVERGED
replica) fetches its source's state while it contributes zeros, and takes it as its own
only when the step commits (AdoptFetched, then ApplyStep): after a retry every rank of the
replica is still at its old step, whichever of their fetches finished. A fetch writes the
model and the optimizer tensors it finds in place, so from StartFetch until a commit adopts a
whole fetch the rank is *torn*: its live state is neither its step's nor the source's. A torn
rank serves nobody (no ServeState at Begin), reports no digest, and while a plan calls it
healthy it stays out of the ring and votes no (it trains nothing from a torn state), until a
plan calls it behind again and a fetch commits, or a checkpoint replaces its state. When the
controller offers a rollback quorum a durable
checkpoint newer than the replica's own state, the coordinator orders every rank to load it
instead of training (ResumeOrdered); each rank then begins the checkpoint's step. Events
that come from the coordinator and do not fit --
late, duplicated, stale -- are ignored; a local event in the wrong state is a bug: it
raises ProtocolError and changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Union

from fthsdp.settings import RuntimeSettings
from fthsdp.step.events import (FROM_COORDINATOR, AdoptFetched, ApplyOuterStep, ApplyStep, AwaitReduce, Begin,
                                BeginInner, CancelFetch, Checkpoint, CheckpointLoaded, Close, Closed, Concluded,
                                ConfigureRing, CoordinatorLost, DecisionArrived, DropGradients, DropReduce, Effect, End,
                                Ended, Event, Fail, FetchFinished, FinishedArrived, GatherReduced, InnerStep,
                                LoadCheckpoint, PlanArrived, PlanRefused, ReducePseudoGradient, Reduced, Refusal,
                                ResumeOrdered, SendBegin, SendClose, SendDigest, SendVote, ServeState, StartFetch,
                                StartReduce, StepOutcome, StopServing, TakePseudoGradient, Tick)
from fthsdp.step.plan import RankPlan
from fthsdp.step.rank_state import (_HELD, INF, Fetch, Flight, Phase, ProtocolError, RankState,  # noqa: F401 - re-exported
                                    initial_state)


Result = tuple[RankState, tuple[Effect, ...]]


# ---------------------------------------------------------------- advance


def advance(state: RankState, event: Event, now: float) -> Result:
    """The next state and the effects to execute, in order. Pure."""
    handler = _FLIGHT_TABLE.get((state.flight, type(event))) if state.phase in _FLIES else None
    handler = handler or _TABLE.get((state.phase, type(event)))
    if handler is None:
        if isinstance(event, FROM_COORDINATOR) or isinstance(event, Tick):
            return state, ()
        raise ProtocolError(f"rank {state.settings.rank}: {type(event).__name__} is not allowed while the step is "
                            f"{state.phase.name} (step {state.step})")
    return handler(state, event, now, state.settings)


def next_deadline(state: RankState) -> float:
    """When a Tick can next change something (INF: only another event can)."""
    if state.phase in (Phase.TRAINING, Phase.SYNCING):
        return state.fetch_deadline if state.fetch is Fetch.RUNNING else INF
    if state.phase is Phase.INNER:  # a sync in flight keeps its deadlines
        return state.deadline if state.flight is not Flight.NONE else INF
    return state.deadline


_replace = dataclasses.replace


def _begin(state: RankState, _ev: Begin, now: float, s: RuntimeSettings) -> Result:
    if s.max_steps and state.step >= s.max_steps:
        reason = f"max_steps={s.max_steps} reached"
        return _replace(state, phase=Phase.ENDED, reason=reason), (Ended(reason),)
    k, lead = s.inner_steps_per_sync, s.overlap_steps or s.sync_plan_ahead_steps
    if s.semi_synchronous and state.inner < k:  # an inner step: no coordinator (but a sync may start)
        first = state.inner == 0
        new = _replace(state, phase=Phase.INNER, loss=0.0 if first else state.loss,
                       tokens=state.tokens - state.tokens_voted if first else state.tokens,
                       tokens_voted=0 if first else state.tokens_voted)
        if lead and state.inner == k - lead and state.flight is Flight.NONE and not state.torn:
            # the sync goes ahead: its live state moves on, so nobody may fetch it (no ServeState)
            new = _replace(new, flight=Flight.PLANNING, deadline=now + s.plan_timeout_s, plan=None, quorum_id=0,
                           reduced=False, failure="", deferred=False, ledger_before=state.ledger)
            return new, (SendBegin(state.step), BeginInner(state.step, state.inner))
        return new, (BeginInner(state.step, state.inner),)
    if state.flight is not Flight.NONE:
        return _due(state, now, s)
    sums = s.semi_synchronous  # a sync reports what its inner steps trained
    new = _replace(state, phase=Phase.PLANNING, deadline=now + s.plan_timeout_s, plan=None, quorum_id=0,
                   reduced=False, failure="", fetch=Fetch.NONE, fetch_deadline=INF, ending=False,
                   loss=state.loss if sums else 0.0, tokens=state.tokens if sums else 0, ledger_before=state.ledger)
    if state.torn:  # its live state is not the state at its step: nobody may fetch it
        return new, (SendBegin(state.step),)
    return new, (ServeState(state.step), SendBegin(state.step))


def _begin_again(state: RankState, _ev: Begin, _now: float, _s: RuntimeSettings) -> Result:
    return state, (Ended(state.reason),) if state.phase is Phase.ENDED else (Fail(state.reason),)


def _not_the_answer(state: RankState, attempt: int, step: int, what: str, s: RuntimeSettings) -> Result | None:
    """None when an answer to this rank's begin is the one it waits for; else what to do with it."""
    if attempt <= state.attempt:
        return state, ()  # late or duplicated
    if step != state.step:
        return _fail(state, f"rank {s.rank} at step {state.step} got {what} for step {step}: the replica's "
                            f"ranks disagree on their step; exit so the replica is restarted and catches up")
    return None


def _plan(state: RankState, ev: PlanArrived, now: float, s: RuntimeSettings) -> Result:
    if (other := _not_the_answer(state, ev.attempt, ev.step, "a plan", s)) is not None:
        return other
    plan = ev.plan
    new = _replace(state, phase=Phase.TRAINING, attempt=ev.attempt, deadline=INF, plan=plan,
                   quorum_id=plan.quorum_id if plan else 0, ledger_before=state.ledger)
    new, effects = _planned(new, plan, ev.error, now, s)
    if s.semi_synchronous:  # a sync: no training script between plan and vote
        fragment = s.fragment_at(new.plan.step if new.plan is not None else new.step)  # the quorum's fragment
        return _replace(new, phase=Phase.SYNCING), (*effects, ReducePseudoGradient(new.plan, fragment))
    return new, effects


def _planned(new: RankState, plan: RankPlan | None, error: str, now: float, s: RuntimeSettings) -> Result:
    if plan is None:
        return _replace(new, failure=error or "no plan"), ()
    if not plan.behind and plan.step != new.step:
        # Taking part with the wrong state could put a wrong gradient into other replicas' sums:
        # stay out of the ring (every replica of the ring retries) and vote no.
        return _replace(new, plan=None, failure=_wrong_step(plan, new, s)), ()
    if not plan.behind and new.torn:
        return _replace(new, plan=None, failure=f"quorum {plan.quorum_id} calls replica {s.replica_id} healthy at "
                                                f"step {plan.step}, but rank {s.rank}'s state was partly overwritten "
                                                f"by a catch-up that never committed; it waits to be caught up "
                                                f"again"), ()
    if plan.behind:
        new = _replace(new, fetch=Fetch.RUNNING, fetch_deadline=now + s.fetch_budget_s, torn=True)
        return new, (StopServing(), ConfigureRing(plan), StartFetch(plan))
    return new, (ServeState(new.step, plan.fetchers), ConfigureRing(plan))


def _wrong_step(plan: RankPlan, state: RankState, s: RuntimeSettings) -> str:
    return f"quorum {plan.quorum_id} calls replica {s.replica_id} healthy at step {plan.step} but it is at step {state.step}"


def _resume(state: RankState, ev: ResumeOrdered, _now: float, s: RuntimeSettings) -> Result:
    if (other := _not_the_answer(state, ev.attempt, ev.step, "a resume order", s)) is not None:
        return other
    resume_to = ev.checkpoint_step + 1
    if resume_to <= state.step:
        return _fail(state, f"quorum {ev.quorum_id} tells rank {s.rank} to resume from the checkpoint of step "
                            f"{ev.checkpoint_step}, but it holds the state at step {state.step} already")
    new = _replace(state, phase=Phase.RESUMING, attempt=ev.attempt, deadline=INF, plan=None, quorum_id=ev.quorum_id,
                   resume_to=resume_to, **_LANDED)
    return new, (StopServing(), LoadCheckpoint(resume_to))


def _loaded(state: RankState, ev: CheckpointLoaded, _now: float, s: RuntimeSettings) -> Result:
    if ev.ledger is None or ev.step != state.resume_to:
        why = ev.reason or f"it holds the state at step {ev.step}, not at step {state.resume_to}"
        return _fail(state, f"rank {s.rank} cannot resume from the checkpoint of step {state.resume_to - 1} that "
                            f"quorum {state.quorum_id} offered: {why}; exit so the replica is restarted")
    new = _replace(state, phase=Phase.IDLE, step=ev.step, ledger=ev.ledger, ledger_before=None, resume_to=-1,
                   torn=False, inner=0, tokens=0, tokens_voted=0)
    return new, ()


def _refused(state: RankState, ev: PlanRefused, now: float, s: RuntimeSettings) -> Result:
    if ev.attempt <= state.attempt:
        return state, ()
    state = _replace(state, attempt=ev.attempt)
    if ev.kind is Refusal.FINISHED:
        return _replace(state, phase=Phase.ENDED, deadline=INF, reason=ev.reason, **_LANDED), (Ended(ev.reason),)
    if ev.kind is Refusal.FATAL:
        return _fail(state, ev.reason)
    return _retry(state, f"no plan: {ev.reason}", s)


def _planning_decision(state: RankState, ev: DecisionArrived, now: float, s: RuntimeSettings) -> Result:
    """The plan of a newer attempt never arrived, but its decision did: without this rank's
    vote it can only have been a retry."""
    if ev.attempt <= state.attempt:
        return state, ()
    if ev.commit:
        return _fail(state, _COMMIT_WITHOUT_VOTE.format(rank=s.rank, attempt=ev.attempt))
    return _retry(_replace(state, attempt=ev.attempt), ev.reason, s)


def _reduced(state: RankState, ev: Reduced, _now: float, _s: RuntimeSettings) -> Result:
    failure = state.failure or ("" if ev.ok else ev.reason or "gradient reduction failed")
    return _replace(state, reduced=True, failure=failure), ()


def _inner_end(state: RankState, ev: End, _now: float, s: RuntimeSettings) -> Result:
    inner, tau = state.inner + 1, s.overlap_steps
    effects: tuple[Effect, ...] = (InnerStep(state.step, state.inner),)
    if inner == s.inner_steps_per_sync - tau:
        effects += (TakePseudoGradient(state.step, s.fragment_at(state.step), keep_local=tau > 0),)
    return _replace(state, phase=Phase.IDLE, inner=inner, loss=ev.loss, tokens=state.tokens + ev.tokens), effects


def _sync_reduced(state: RankState, ev: Reduced, now: float, s: RuntimeSettings) -> Result:
    """The pseudo-gradient is averaged (or failed): the rank votes once its catch-up is in too."""
    state, _ = _reduced(state, ev, now, s)
    if state.fetch is Fetch.RUNNING:
        return _replace(state, ending=True), ()
    return _vote(state, now, s)


def _fetched(state: RankState, ev: FetchFinished, now: float, s: RuntimeSettings) -> Result:
    if state.fetch is not Fetch.RUNNING:
        raise ProtocolError(f"rank {s.rank}: FetchFinished while the fetch is {state.fetch.name}")
    plan = state.plan
    assert plan is not None
    if ev.ok and ev.ledger is not None:
        new = _replace(state, fetch=Fetch.DONE, fetched_ledger=ev.ledger)
        effects: tuple[Effect, ...] = ()
    else:
        new = _replace(state, fetch=Fetch.FAILED, failure=state.failure or ev.reason or "catch-up fetch failed")
        effects = ()
    if new.ending:
        new, vote = _vote(new, now, s)
        effects += vote
    return new, effects


def _end(state: RankState, ev: End, now: float, s: RuntimeSettings) -> Result:
    if not state.reduced:
        raise ProtocolError(f"rank {s.rank}: End before the gradients were reduced (sync_gradients first)")
    state = _replace(state, loss=ev.loss, tokens=ev.tokens)
    if state.fetch is Fetch.RUNNING:
        return _replace(state, ending=True), ()
    return _vote(state, now, s)


def _vote(state: RankState, now: float, s: RuntimeSettings, ahead: bool = False) -> Result:
    vote = SendVote(state.attempt, not state.failure, state.failure, state.loss, state.tokens)
    where = {"flight": Flight.VOTING} if ahead else {"phase": Phase.VOTING}
    return _replace(state, deadline=now + s.decision_timeout_s, tokens_voted=state.tokens, **where), (vote,)


# ---------------------------------------------------------------- a sync in flight (the overlap)


def _ahead_plan(state: RankState, ev: PlanArrived, now: float, s: RuntimeSettings) -> Result:
    """The plan of a sync in flight: start the reduce in the background, or vote no at once."""
    if (other := _not_the_answer(state, ev.attempt, ev.step, "a plan", s)) is not None:
        return other
    plan = ev.plan
    new = _replace(state, attempt=ev.attempt, deadline=INF, plan=plan, quorum_id=plan.quorum_id if plan else 0)
    if plan is None or (not plan.behind and plan.step != state.step):
        return _vote(_replace(new, failure=ev.error or "no plan" if plan is None else _wrong_step(plan, new, s)),
                     now, s, ahead=True)
    if plan.behind or plan.fetchers or len(plan.included) < len(plan.ftar_members):
        # Nobody may fetch a moving state: every replica of the quorum sees the catch-up and
        # defers it, staying out of the ring (no sum another replica could commit without it).
        why = (f"quorum {plan.quorum_id} has a replica catching up ({len(plan.included)} of "
               f"{len(plan.ftar_members)} members healthy): a catch-up needs a quiescent sync: retried at the due "
               f"step")
        return _vote(_replace(new, failure=why, deferred=True), now, s, ahead=True)
    if not s.overlap_steps:  # planned ahead: the pseudo-gradient is taken at the due step's End
        return _replace(new, flight=Flight.PLANNED), (ConfigureRing(plan, serving=False),)
    new = _replace(new, flight=Flight.REDUCING, background=True)
    return new, (ConfigureRing(plan, serving=False), StartReduce(plan, s.fragment_at(plan.step)))


def _ahead_reduced(state: RankState, ev: Reduced, now: float, s: RuntimeSettings) -> Result:
    state, _ = _reduced(state, ev, now, s)
    return _vote(state, now, s, ahead=True)


def _ahead_decided(state: RankState, ev: DecisionArrived, now: float, s: RuntimeSettings) -> Result:
    """A commit is held until the due step, so that every run applies it at the same inner step."""
    if ev.attempt != state.attempt:
        return state, ()
    if not ev.commit:
        return _retry(state, ev.reason, s)
    if state.failure or state.plan is None:
        return _fail(state, _COMMITTED_A_NO.format(attempt=ev.attempt, rank=s.rank))
    return _replace(state, flight=Flight.COMMITTED, deadline=INF), ()


def _due(state: RankState, now: float, s: RuntimeSettings) -> Result:
    """Begin at inner = K with a sync in flight: apply a held commit, or wait for the rest of the
    sync as a blocking one (its deadlines run on)."""
    if state.flight is Flight.COMMITTED:
        return _commit(state, s)
    if state.flight is Flight.PLANNED:  # the plan asked for ahead: the blocking sync from its reduce on
        plan = state.plan
        assert plan is not None
        new = _replace(state, phase=Phase.SYNCING, flight=Flight.NONE, fetch=Fetch.NONE, fetch_deadline=INF,
                       ending=False)
        return new, (ReducePseudoGradient(plan, s.fragment_at(plan.step), planned_ahead=True),)
    phase = {Flight.PLANNING: Phase.PLANNING, Flight.REDUCING: Phase.SYNCING, Flight.VOTING: Phase.VOTING}
    new = _replace(state, phase=phase[state.flight], flight=Flight.NONE)
    return new, (AwaitReduce(),) if state.flight is Flight.REDUCING else ()


def _training_tick(state: RankState, _ev: Tick, now: float, s: RuntimeSettings) -> Result:
    if state.fetch is not Fetch.RUNNING or now < state.fetch_deadline:
        return state, ()
    plan = state.plan
    assert plan is not None
    reason = (f"catch-up fetch of step {plan.step} from {plan.source_replica} did not finish within "
              f"{s.fetch_budget_s:g}s")
    new = _replace(state, fetch=Fetch.FAILED, failure=state.failure or reason)
    effects: tuple[Effect, ...] = (CancelFetch(reason),)
    if new.ending:
        new, vote = _vote(new, now, s)
        effects += vote
    return new, effects


def _training_message(state: RankState, ev: Union[PlanArrived, PlanRefused, DecisionArrived], now: float,
                      s: RuntimeSettings) -> Result:
    """Before this rank voted, the coordinator can only have ended the attempt as a retry."""
    if ev.attempt < state.attempt or (ev.attempt == state.attempt and not isinstance(ev, DecisionArrived)):
        return state, ()
    if isinstance(ev, DecisionArrived) and ev.commit:
        return _fail(state, _COMMIT_WITHOUT_VOTE.format(rank=s.rank, attempt=ev.attempt))
    reason = ev.reason if isinstance(ev, DecisionArrived) else f"attempt {state.attempt} ended without this rank"
    return _retry(state, reason, s)


def _decided(state: RankState, ev: DecisionArrived, now: float, s: RuntimeSettings) -> Result:
    if ev.attempt != state.attempt:
        return state, ()  # a stale decision; nothing newer can be decided without this rank's begin
    if not ev.commit:
        return _retry(state, ev.reason, s)
    if state.failure or state.plan is None:
        return _fail(state, _COMMITTED_A_NO.format(attempt=ev.attempt, rank=s.rank))
    return _commit(state, s)


def _voting_tick(state: RankState, _ev: Tick, now: float, s: RuntimeSettings) -> Result:
    if now < state.deadline:
        return state, ()
    return _fail(state, f"rank {s.rank} voted on attempt {state.attempt} (step {state.step}) but no decision came "
                        f"within {s.decision_timeout_s:g}s: it cannot know whether its replica committed; exit so "
                        f"the replica is restarted and catches up")


def _planning_tick(state: RankState, _ev: Tick, now: float, s: RuntimeSettings) -> Result:
    if now < state.deadline:
        return state, ()
    return _fail(state, f"rank {s.rank} got no answer from its coordinator (rank 0) for step {state.step} within "
                        f"{s.plan_timeout_s:g}s; rank 0 is hung or gone: exit so the replica is restarted")


def _commit(state: RankState, s: RuntimeSettings) -> Result:
    plan = state.plan
    before = state.fetched_ledger if plan is not None and plan.behind else state.ledger_before
    assert plan is not None and before is not None and (not plan.behind or state.fetch is Fetch.DONE)
    next_step = plan.step + 1
    outcome = StepOutcome(True, plan.step, plan.quorum_id, state.attempt, plan.behind, plan.included,
                          dict(before.positions), "committed", plan.lr_scale)
    effects: list[Effect] = [StopServing(plan.fetchers, s.fetch_hold_timeout_s if plan.fetchers else 0.0)]
    if plan.behind:
        effects.append(AdoptFetched(plan.step))
    if state.background:
        effects.append(GatherReduced(s.fragment_at(plan.step)))
    effects += [ApplyOuterStep(plan, s.fragment_at(plan.step)) if s.semi_synchronous else ApplyStep(plan),
                Concluded(outcome)]
    if plan.report_digest:
        effects.append(SendDigest(state.attempt, plan.step))
    if s.checkpoint_every_steps and next_step % s.checkpoint_every_steps == 0:
        # every rank: a sharded replica's ranks write their shards together (the Manager knows)
        effects.append(Checkpoint(next_step, plan.writes_checkpoint_state))
    new = _replace(state, phase=Phase.IDLE, step=next_step, ledger=before.advanced(plan.included, s.inner_steps_per_sync),
                   deadline=INF, fetch=Fetch.NONE, fetched_ledger=None, failures_in_a_row=0, last_failure="",
                   torn=state.torn and not plan.behind, inner=0, **_LANDED)
    return new, tuple(effects)


def _retry(state: RankState, reason: str, s: RuntimeSettings) -> Result:
    effects: list[Effect] = []
    if state.fetch in _HELD:
        effects.append(CancelFetch(reason))
    if state.phase in (Phase.TRAINING, Phase.SYNCING, Phase.VOTING):
        effects.append(DropGradients(reason))
    elif state.background:
        effects.append(DropReduce(reason))
    plan = state.plan
    before = state.ledger_before or state.ledger
    effects.append(Concluded(StepOutcome(
        False, plan.step if plan else state.step, state.quorum_id, state.attempt, bool(plan and plan.behind),
        plan.included if plan else (), dict(before.positions), reason, plan.lr_scale if plan else 1.0)))
    failures = state.failures_in_a_row + (0 if state.deferred else 1)  # a deferral is no failure
    new = _replace(state, phase=Phase.IDLE, deadline=INF, fetch=Fetch.NONE, fetched_ledger=None,
                   failures_in_a_row=failures, last_failure=reason, **_LANDED)
    if failures > s.max_retries:
        message = (f"step {state.step} failed {failures} times in a row, more than max_retries={s.max_retries}; "
                   f"last failure: {reason}")
        return _replace(new, phase=Phase.FAILED, reason=message), (*effects, Fail(message, retries_exhausted=True))
    return new, tuple(effects)


def _fail(state: RankState, message: str) -> Result:
    effects: tuple[Effect, ...] = (CancelFetch(message),) if state.fetch in _HELD else ()
    new = _replace(state, phase=Phase.FAILED, deadline=INF, fetch=Fetch.NONE, reason=message, **_LANDED)
    return new, (*effects, Fail(message))


def _lost(state: RankState, ev: CoordinatorLost, _now: float, s: RuntimeSettings) -> Result:
    return _fail(state, f"rank {s.rank} lost its coordinator (rank 0): {ev.reason}; exit so the replica is "
                        f"restarted and catches up")


def _close(state: RankState, ev: Close, now: float, s: RuntimeSettings) -> Result:
    effects: list[Effect] = []
    if state.fetch in _HELD:
        effects.append(CancelFetch(ev.reason))
    if state.phase in (Phase.TRAINING, Phase.SYNCING):
        effects.append(DropGradients(ev.reason))
    elif state.background:
        effects.append(DropReduce(ev.reason))
    effects.append(SendClose(state.step, ev.reason))
    new = _replace(state, phase=Phase.FINISHING, deadline=now + s.finish_timeout_s, fetch=Fetch.NONE, reason=ev.reason,
                   **_LANDED)
    return new, tuple(effects)


def _close_failed(state: RankState, _ev: Close, _now: float, _s: RuntimeSettings) -> Result:
    return state, (Closed(False, state.reason),)


def _nothing(state: RankState, _ev: Event, _now: float, _s: RuntimeSettings) -> Result:
    return state, ()


def _finished(state: RankState, ev: FinishedArrived, _now: float, _s: RuntimeSettings) -> Result:
    return _replace(state, phase=Phase.FINISHED, deadline=INF, reason=ev.reason), (Closed(ev.clean, ev.reason),)


def _finishing_tick(state: RankState, _ev: Tick, now: float, s: RuntimeSettings) -> Result:
    if now < state.deadline:
        return state, ()
    reason = f"the coordinator did not confirm the replica finished within {s.finish_timeout_s:g}s"
    return _replace(state, phase=Phase.FINISHED, deadline=INF, reason=reason), (Closed(False, reason),)


def _finishing_lost(state: RankState, ev: CoordinatorLost, _now: float, _s: RuntimeSettings) -> Result:
    reason = f"the coordinator went away before confirming the replica finished: {ev.reason}"
    return _replace(state, phase=Phase.FINISHED, deadline=INF, reason=reason), (Closed(False, reason),)


#: the flight's fields once an attempt ended (committed, retried, failed, closed)
_LANDED = {"flight": Flight.NONE, "background": False, "deferred": False}
_COMMITTED_A_NO = ("the coordinator committed attempt {attempt} although rank {rank} voted no; exit so the replica is "
                   "restarted and catches up")
_COMMIT_WITHOUT_VOTE = ("the coordinator committed attempt {attempt} before rank {rank} voted: the replica's ranks "
                        "disagree; exit so the replica is restarted and catches up")

Handler = Callable[[RankState, Event, float, RuntimeSettings], Result]
P = Phase
_TABLE: dict[tuple[Phase, type], Handler] = {
    (P.IDLE, Begin): _begin,
    (P.IDLE, Close): _close,
    (P.IDLE, CoordinatorLost): _lost,
    (P.PLANNING, PlanArrived): _plan,
    (P.PLANNING, ResumeOrdered): _resume,
    (P.PLANNING, PlanRefused): _refused,
    (P.PLANNING, DecisionArrived): _planning_decision,
    (P.PLANNING, Tick): _planning_tick,
    (P.PLANNING, Close): _close,
    (P.PLANNING, CoordinatorLost): _lost,
    (P.INNER, End): _inner_end,
    (P.INNER, Close): _close,
    (P.INNER, CoordinatorLost): _lost,
    (P.SYNCING, Reduced): _sync_reduced,
    (P.SYNCING, FetchFinished): _fetched,
    (P.SYNCING, Tick): _training_tick,
    (P.SYNCING, PlanArrived): _training_message,
    (P.SYNCING, PlanRefused): _training_message,
    (P.SYNCING, DecisionArrived): _training_message,
    (P.SYNCING, Close): _close,
    (P.SYNCING, CoordinatorLost): _lost,
    (P.TRAINING, Reduced): _reduced,
    (P.TRAINING, FetchFinished): _fetched,
    (P.TRAINING, End): _end,
    (P.TRAINING, Tick): _training_tick,
    (P.TRAINING, PlanArrived): _training_message,
    (P.TRAINING, PlanRefused): _training_message,
    (P.TRAINING, DecisionArrived): _training_message,
    (P.TRAINING, Close): _close,
    (P.TRAINING, CoordinatorLost): _lost,
    (P.VOTING, DecisionArrived): _decided,
    (P.VOTING, Tick): _voting_tick,
    (P.VOTING, CoordinatorLost): _lost,
    (P.VOTING, Close): _close,
    (P.RESUMING, CheckpointLoaded): _loaded,
    (P.RESUMING, CoordinatorLost): _lost,
    (P.RESUMING, Close): _close,
    (P.ENDED, Begin): _begin_again,
    (P.ENDED, Close): _close,
    (P.FINISHING, FinishedArrived): _finished,
    (P.FINISHING, Tick): _finishing_tick,
    (P.FINISHING, CoordinatorLost): _finishing_lost,
    (P.FINISHING, Close): _nothing,
    (P.FINISHED, Close): _nothing,
    (P.FAILED, Begin): _begin_again,
    (P.FAILED, Close): _close_failed,
}
F = Flight
#: the phases in which a sync in flight takes its events (between the overlap's inner steps, and during one)
_FLIES = (Phase.IDLE, Phase.INNER)
#: a sync in flight, between and during the overlap's inner steps: its events before the phase's;
#: what is not its own is handled as in the blocking phase it stands for (PLANNING, SYNCING, VOTING)
_FLIGHT_TABLE: dict[tuple[Flight, type], Handler] = {
    (F.PLANNING, PlanArrived): _ahead_plan,
    **{(F.PLANNING, e): _TABLE[(P.PLANNING, e)] for e in (ResumeOrdered, PlanRefused, DecisionArrived, Tick)},
    (F.REDUCING, Reduced): _ahead_reduced,
    **{(F.REDUCING, e): _TABLE[(P.SYNCING, e)] for e in (PlanArrived, PlanRefused, DecisionArrived)},
    (F.VOTING, DecisionArrived): _ahead_decided,
    (F.VOTING, Tick): _TABLE[(P.VOTING, Tick)],
    **{(F.PLANNED, e): _TABLE[(P.SYNCING, e)] for e in (PlanArrived, PlanRefused, DecisionArrived)},
}

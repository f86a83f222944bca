"""The Manager: one trainer process's executor of the replica step protocol.

    manager = Manager(model, optimizer, RuntimeSettings.from_env()).start()
    for batch in manager.batches(batch_at):   # each next() begins a step (quorum, plan, catch-up)
        loss = loss_fn(model(batch)); loss.backward()
        manager.end_step(loss)                # average, vote, then commit or retry -> bool
    manager.close()                           # the replica is FINISHED once every rank got here

With settings.sync_mode local_sgd or diloco the same loop trains sync_every_steps inner steps
on the replica's own group per step of the protocol, and the end_step() of the last one syncs
(fthsdp/sync/outer.py, fthsdp/sync/effects.py); streaming_diloco syncs one of sync_fragments
fragments every sync_every_steps / sync_fragments inner steps, overlapping sync_overlap_steps.

fthsdp/wiring.py opens the parts; `_EFFECTS` (the end of this module) maps each effect type to
its handler; fthsdp/step/feeding.py feeds the protocol and waits for frames (fthsdp/step/frames.py
turns them into events). Every step decision is made by the pure protocol (fthsdp/step/protocol.py), and which rank
reads and writes durable checkpoints by fthsdp/state/replica_checkpoints.py; this class feeds
the protocol events -- what the training script called, what the coordinator said, what the catch-up
fetch reported, time passing -- and executes the effects it returns, nothing else. Rank 0
also hosts the replica's coordinator (fthsdp/step/coordinator.py) and is its client over
TCP like every other rank. `start()` does the expensive set-up (the pre-init hook first)
before this rank reports in; the constructor starts nothing. Errors follow
fthsdp/errors.py: recoverable ones become "no" votes; fatal ones are raised.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist

from ftar_kernels import FtarEndpoint
from fthsdp import determinism
from fthsdp.data_ledger import DataLedger, LedgerBatches
from fthsdp.errors import (EXIT_JOB_ALREADY_COMPLETED, ChannelError, ConfigurationError, Fatal, JobAlreadyCompleted,
                           ReplicaFinished, RetryLimitExceeded)
from fthsdp.settings import RuntimeSettings
from fthsdp.state.checkpoint import CheckpointStore
from fthsdp.state.replica_checkpoints import LOAD_ERRORS, ReplicaCheckpoints
from fthsdp.state.digest import rank_digest
from fthsdp.state.fetch_job import FetchJob
from fthsdp.state import snapshot
from fthsdp.state.registry import StateRegistry, Stateful
from fthsdp.state.serve import StateServer
from fthsdp.step import events as ev, messages as msg
from fthsdp.step.client import CoordinatorClient
from fthsdp.step.controller_client import COMPLETED_PREFIX, CONFIGURATION_PREFIX
from fthsdp.step.coordinator import CoordinatorService
from fthsdp.step.feeding import ProtocolFeed
from fthsdp.step.plan import AddressBook, RankPlan
from fthsdp.step.protocol import Flight, Phase, ProtocolError, initial_state
from fthsdp.sync import fsdp
from fthsdp.sync.effects import OUTER_EFFECTS
from fthsdp.sync.gradients import SyncResult, flatten_grads, unflatten_grads_
from fthsdp.sync.outer import OUTER_STATE_NAME, OuterSync, scaled_step
from fthsdp.telemetry import Collectives
from fthsdp.wiring import Parts, Seams, open_parts
from protos import job_secret
from protos import replica_pb2 as rpb

log = logging.getLogger(__name__)
T = TypeVar("T")
#: concluded attempts kept for take_outcomes() (a caller that never takes them keeps only these)
CONCLUDED_KEPT = 1000
__all__ = ["Manager", "Seams", "StepOutcome"]
StepOutcome = ev.StepOutcome


class Manager(ProtocolFeed):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: RuntimeSettings,
                 *, process_group: dist.ProcessGroup | None = None, pre_init: Callable[[], None] | None = None,
                 seams: Seams = Seams()) -> None:
        self.settings = settings.validate()
        self.model, self.optimizer = model, optimizer
        self.process_group, self._pre_init, self._seams = process_group, pre_init, seams
        self.registry = StateRegistry()
        self.incarnation = uuid.uuid4().hex[:12]
        self.last_outcome: StepOutcome | None = None
        #: the attempts concluded since take_outcomes() last took them (the newest CONCLUDED_KEPT)
        self._outcomes: deque[StepOutcome] = deque(maxlen=CONCLUDED_KEPT)
        #: whether this process committed a step; whether it resumed at max_steps (nothing to train)
        self._committed_any = self._resumed_at_end = False
        #: bytes of the last catch-up transfer this rank adopted (its shards only, when sharded)
        self.last_catch_up_bytes = 0
        #: time spent inside the pure protocol, and how many events it took
        self.protocol_s, self.protocol_events = 0.0, 0
        #: semi-synchronous: syncs whose begin went ahead of their due step (an overlap or
        #: sync_plan_ahead_steps), and of the plans asked for ahead those in by the due step
        self.syncs_begun_ahead = self.plans_in_at_due = 0
        self._state = initial_state(self.settings)
        self._params = [p for p in model.parameters() if p.requires_grad]
        #: FSDP2-wrapped: FTAR reduces each group's gradient shard from FSDP's hook
        self.sharded = fsdp.is_sharded(model)
        #: semi-synchronous: the global copy, pseudo-gradient and outer optimizer (registered state)
        self.outer = OuterSync(self._params, self.settings, self.sharded) if self.settings.semi_synchronous else None
        if self.outer is not None:
            self.registry.register(OUTER_STATE_NAME, self.outer)
        self._flat: torch.Tensor | None = None
        self._book = AddressBook()
        self._fetch: FetchJob | None = None
        self._init_feed()  # fthsdp/step/feeding.py
        self._source = snapshot.ServedState(model, optimizer, self.registry, self.settings.copy_state_to_serve,
                                            self.sharded)
        self._started = self._in_step = False
        # with a job secret, checkpoints are signed with it and only signed ones are resumed from
        key = settings.job_secret.key(job_secret.PURPOSE_CHECKPOINT) if settings.job_secret is not None else None
        self.checkpoints = ReplicaCheckpoints(
            seams.checkpoints(CheckpointStore(settings.checkpoint_dir, key=key, keep_last=settings.checkpoint_keep_last)),
            self.settings, model, optimizer, self.registry, sharded=self.sharded, process_group=process_group,
        ) if settings.checkpoint_dir else None
        self._parts: Parts | None = None
        self.coordinator: CoordinatorService | None = None
        self.client: CoordinatorClient | None = None
        self.state_server: StateServer | None = None
        self.endpoint: FtarEndpoint | None = None
        #: this rank's collective telemetry (a ring the agent reads; none unless it asked for one)
        self.collectives = Collectives(None, settings.world_size)

    # ------------------------------------------------------------------ what the script sees

    @property
    def step(self) -> int:
        """The next step to train: this rank holds the committed state at its start."""
        return self._state.step

    @property
    def inner(self) -> int:
        """Semi-synchronous: the inner steps trained since the last sync (0 at every step start)."""
        return self._state.inner

    @property
    def ledger(self) -> DataLedger:
        return self._state.ledger

    @property
    def phase(self) -> Phase:
        return self._state.phase

    @property
    def plan(self) -> RankPlan | None:
        in_step = self._state.phase in (Phase.TRAINING, Phase.SYNCING, Phase.VOTING)
        return self._state.plan if in_step or self.sync_in_flight else None

    @property
    def sync_in_flight(self) -> bool:
        """streaming_diloco's overlap: a fragment's sync runs while this replica trains inner steps."""
        return self._state.flight is not Flight.NONE

    @property
    def is_behind(self) -> bool:
        """True while this step only catches up (its forward/backward will be discarded)."""
        return self.plan is not None and self.plan.behind

    @property
    def last_checkpoint_error(self) -> str:
        """Why this rank's last checkpoint write failed ("" after a good one, or none)."""
        return self.checkpoints.last_error if self.checkpoints is not None else ""

    @property
    def finished(self) -> bool:
        return self._state.phase in (Phase.ENDED, Phase.FINISHING, Phase.FINISHED)

    def take_outcomes(self) -> list[StepOutcome]:
        """Every attempt concluded since the last call, oldest first: each committed step or
        sync, and each attempt that will be retried. A semi-synchronous sync may take several
        attempts inside one end_step() (and an overlapped one may conclude during inner steps),
        where `last_outcome` shows only the last. At most CONCLUDED_KEPT are kept between calls."""
        taken = list(self._outcomes)
        self._outcomes.clear()
        return taken

    def register_state(self, name: str, obj: Stateful) -> None:
        """Make `obj` (anything with state_dict()/load_state_dict() that is the same on every
        replica: an LR scheduler) part of the replicated training state: it travels with catch-up
        and checkpoints and is digested. Change it only between steps (see
        fthsdp/state/registry.py). Data positions are per replica: samplers and DataLoaders are
        refused (TypeError), the ledger keeps them (fthsdp/data.py). Before start()."""
        self._require_not_started("register_state")
        self.registry.register(name, obj)

    def register_rng(self, seed: int | None = None) -> None:
        """Let the runtime own the torch, numpy and Python RNG streams (reseeded per step from a
        chain that travels; default seed: torch.initial_seed()). Before start()."""
        self._require_not_started("register_rng")
        self.registry.register_rng(seed)

    def digest(self) -> str:
        """SHA-256 (hex) of this rank's committed state at the start of `step`: the step, the
        ledger, the model, the optimizer and every registered object (fthsdp/state/digest.py).
        The digest the controller compares: equal on every replica that committed the same step
        (rank by rank when sharded). Call it between steps. Semi-synchronous: the global state and
        the outer optimizer (registered); the inner optimizer's state is each replica's own. In
        streaming_diloco the model holds local fragments between their syncs: the global copy is
        registered state and the model is left out."""
        st = self._state
        optimizer = None if self.outer is not None else self.optimizer
        model = None if self.outer is not None and self.outer.streaming else self.model
        return rank_digest(st.step, st.ledger.to_json(), model, optimizer, self.registry.state_dicts()).hex()

    def batches(self, batch_at: Callable[[str, int], T]) -> Iterator[T]:
        """This replica's batches at its ledger position, one per step attempt (exactly once);
        each next() begins the step; the iteration ends when the replica has no more steps."""
        return LedgerBatches(lambda: self._state.ledger, self.settings.replica_id, batch_at, self._begin_for_batch,
                             lambda: self._state.inner)

    # ------------------------------------------------------------------ set-up and shutdown

    def start(self) -> "Manager":
        """The expensive set-up (fthsdp/wiring.py opens the parts), then this rank reports in."""
        self._require_not_started("start")
        s = self.settings
        if s.deterministic:
            log.info("replica %s rank %s: deterministic mode: %s", s.replica_id, s.rank, "; ".join(determinism.apply()))
            if self.registry.rng is None:
                self.registry.register_rng(s.deterministic_seed)
        if self._pre_init is not None:
            self._pre_init()
        self._restore_checkpoint()
        try:
            parts = open_parts(s, self._seams, self.incarnation, self.process_group, self._source.snapshot)
        except ChannelError as exc:
            raise Fatal(f"{exc}; check the coordinator address (rank 0 must be running), then restart") from None
        self._parts = parts
        self.endpoint, self.collectives, self.sync = parts.endpoint, parts.collectives, parts.sync
        self.state_server, self.coordinator, self.client = parts.state_server, parts.coordinator, parts.client
        if self.sharded and self.outer is None:  # inner steps reduce inside the replica only
            fsdp.install_all_reduce_hooks(self.model, self._reduce_shard)
        self._started = True
        self._start_waker()
        self._source.training_thread = threading.current_thread()
        log.info("replica %s rank %s started at step %s", s.replica_id, s.rank, self.step)
        return self

    def close(self) -> None:
        """Leave the replica cleanly: once every rank closed, the coordinator reports the
        replica FINISHED to the controller, then lets every rank go (bounded waits). In
        streaming_diloco the model then takes the global copy of every fragment (the last
        committed global model; a sync in flight is dropped), so what the script evaluates or
        saves after close() is the global model, not this replica's own inner steps."""
        if not self._started:
            return
        try:
            if self._state.phase not in (Phase.FINISHING, Phase.FINISHED):
                self._feed(ev.Close())
            self._wait_while(Phase.FINISHING)
        except (Fatal, ProtocolError) as exc:
            log.warning("replica %s rank %s: closing: %s", self.settings.replica_id, self.settings.rank, exc)
        finally:
            self._teardown()
            if self.outer is not None and self.outer.streaming:
                self.outer.load_global()

    def abort(self) -> None:
        """Stop at once without finishing the replica (after an error: the agent restarts it)."""
        self._teardown()

    def __enter__(self) -> "Manager":
        return self if self._started else self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close() if exc_type is None else self.abort()

    def _teardown(self) -> None:
        self._started = False
        self._stop_waker()  # before the channel and the ring it uses close
        if self._fetch is not None:
            self._fetch.cancel(self.settings.fetch_timeout_s)
            self._fetch = None
        if self._parts is not None:
            self._parts.close()
        self._parts = None
        self.client = self.coordinator = self.state_server = self.endpoint = None

    def _restore_checkpoint(self) -> None:
        resumed = self.checkpoints.resume_point() if self.checkpoints is not None else None
        if resumed is not None:
            self._state = initial_state(self.settings, *resumed)
        self._resumed_at_end = resumed is not None and 0 < self.settings.max_steps <= self._state.step

    # ------------------------------------------------------------------ the step

    def begin_step(self) -> RankPlan | None:
        """Start the next step: quorum, plan, catch-up (behind). Returns the plan (None when the
        quorum answer did not fit this rank: it then votes no). Idempotent within a step.
        Raises ReplicaFinished when there are no more steps."""
        self._require_started()
        self._drain_flight()
        while self._state.phase not in (Phase.TRAINING, Phase.VOTING, Phase.INNER):
            if self._state.phase is Phase.ENDED:
                self._feed(ev.Begin())  # re-states why (Ended), changes nothing
                self._check_not_too_late()
                raise ReplicaFinished(self._state.reason)
            self._feed_begin()
            self._wait_while(Phase.PLANNING, Phase.SYNCING, Phase.VOTING)  # a sync runs to its decision
            if self._state.phase is Phase.ENDED:
                self._check_not_too_late()
                raise ReplicaFinished(self._state.reason)
            # IDLE again: the begin was refused for now (counted; fatal past max_retries), or the
            # replica resumed from a checkpoint and begins the checkpoint's step next
        self._in_step = True
        return self._state.plan

    def _check_not_too_late(self) -> None:
        """A process that committed no step and learns the job is COMPLETED (or resumed from a checkpoint
        of the last step) started too late: JobAlreadyCompleted, never the end of its loop."""
        if not self._committed_any and (COMPLETED_PREFIX in self._state.reason or self._resumed_at_end):
            why = self._state.reason if COMPLETED_PREFIX in self._state.reason else f"its checkpoint is at step " \
                f"{self._state.step}, the last of max_steps={self.settings.max_steps}"
            raise JobAlreadyCompleted(
                f"replica {self.settings.replica_id} started after the job COMPLETED and trained nothing ({why}); "
                f"write no results and exit with status {EXIT_JOB_ALREADY_COMPLETED}")

    def _begin_for_batch(self) -> bool:
        try:
            self.begin_step()
            return True
        except ReplicaFinished:
            return False

    def sync_gradients(self, loss: float | None = None) -> SyncResult:
        """Average the parameters' gradients for this step in place (after backward). For an
        FSDP2 model: wait for the shards its hooks sent across replicas during backward."""
        self._require_phase(Phase.TRAINING, "sync_gradients")
        if self.sharded:
            result = self.sync.wait_shards(self._state.plan)
        else:
            self._flat = flatten_grads(self._params, self._flat)
            result = self.sync.reduce_(self._flat, self._state.plan)
            unflatten_grads_(self._params, self._flat)
        self._feed(ev.Reduced(result.ok, result.reason))
        return result

    def _reduce_shard(self, shard: torch.Tensor, deferred: bool) -> None:
        """FSDP2's all-reduce hook (fthsdp/sync/fsdp.py): one group's reduce-scatter output."""
        self._require_phase(Phase.TRAINING, "an FSDP gradient shard (backward)")
        self.sync.reduce_shard_(shard, self._state.plan, deferred)

    def reduce_bucket_(self, bucket: torch.Tensor) -> SyncResult:
        """For the DDP communication hook: average one gradient bucket in place."""
        self._require_phase(Phase.TRAINING, "a DDP gradient bucket")
        result = self.sync.reduce_(bucket, self._state.plan)
        self._feed(ev.Reduced(result.ok, result.reason))
        return result

    def end_step(self, loss: float | torch.Tensor | None = None, tokens: int = 0) -> bool:
        """Vote, then commit or retry. Returns True when the step committed. `loss` and
        `tokens` go into the replica's report to the controller."""
        self._require_started()
        if not self._in_step:
            raise ProtocolError(f"end_step() while the step is {self._state.phase.name}: begin_step() first")
        self._drain()  # an early decision (another rank voted no) may be waiting
        value = 0.0 if loss is None else float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        if self._state.phase is Phase.INNER:
            self._feed(ev.End(value, tokens))
            self._in_step = False
            self._drain_flight()
            return self._sync_if_due()
        if self._state.phase is Phase.TRAINING:
            if not self._state.reduced:
                self.sync_gradients()
            self._feed(ev.End(value, tokens))
            self._wait_while(Phase.TRAINING, Phase.VOTING)
        self._in_step = False
        assert self.last_outcome is not None
        return self.last_outcome.committed

    def _sync_if_due(self) -> bool:
        """Semi-synchronous, after the last inner step: the sync, attempt after attempt (bounded by
        max_retries), until it commits (True) or the replica has no more steps (False)."""
        while self._state.phase is Phase.IDLE and self._state.inner == self.settings.inner_steps_per_sync:
            self._feed_begin()
            self._wait_while(Phase.PLANNING, Phase.SYNCING, Phase.VOTING)
        return self._state.phase is Phase.IDLE

    # ------------------------------------------------------------------ executing effects

    def _send(self, frame: rpb.RankFrame) -> None:
        assert self.client is not None
        try:
            self.client.send(frame)
        except ChannelError as exc:
            self._queue.append(ev.CoordinatorLost(str(exc)))

    def _send_begin(self, e: ev.SendBegin) -> None:
        self.syncs_begun_ahead += self._state.phase is Phase.INNER  # sent with an inner step: ahead
        self.collectives.begin(e.step)
        self._send(msg.begin(e.step))

    def _send_vote(self, e: ev.SendVote) -> None:
        self.collectives.vote()
        self._send(msg.vote(e.attempt, e.ok, e.reason, e.loss, e.tokens))

    def _send_digest(self, e: ev.SendDigest) -> None:
        self._send(msg.digest(e.attempt, e.step, bytes.fromhex(self.digest())))

    def _send_close(self, e: ev.SendClose) -> None:
        self._send(msg.close(e.step, e.reason))

    def _serve_state(self, e: ev.ServeState) -> None:
        assert self.state_server is not None
        if e.fetchers:  # the plan names fetchers: serving costs this rank time its peers train in
            self.collectives.disturb()
        self._source.serve(e.step, self._state.ledger.to_json())
        self.state_server.serve(e.step, e.fetchers)

    def _stop_serving(self, e: ev.StopServing) -> None:
        assert self.state_server is not None
        copy = self._source.release()  # an immutable copy is served on while this rank trains on;
        # served() waits for its device-to-host copies: the optimizer step comes after this
        self.state_server.stop(e.wait_for, e.timeout_s, keep=copy.served() if copy is not None else None)

    def _configure_ring(self, e: ev.ConfigureRing) -> None:
        if e.serving and e.plan.fetchers and not e.plan.behind:
            self._source.snapshot()  # at the step boundary, before this step can change the state
        self.sync.configure(e.plan)

    def _start_fetch(self, e: ev.StartFetch) -> None:
        self.collectives.disturb()  # fetching and adopting a catch-up is work its peers do not do
        self._fetch = FetchJob(e.plan, self.settings, self.model, self.optimizer, self.registry).start()

    def _cancel_fetch(self, e: ev.CancelFetch) -> None:
        if self._fetch is not None:
            log.warning("replica %s rank %s: catch-up cancelled: %s", self.settings.replica_id, self.settings.rank,
                        e.reason)
            self._fetch.cancel(self.settings.fetch_timeout_s)
            self._fetch = None

    def _adopt_fetched(self, e: ev.AdoptFetched) -> None:
        fetch, self._fetch = self._fetch, None
        assert fetch is not None and fetch.fetched is not None
        fetch.close()
        try:
            fetch.fetched.adopt_model()
            self.last_catch_up_bytes = fetch.fetched.manifest.total_bytes
            self.optimizer.load_state_dict(fetch.fetched.optimizer_state)
            self.registry.load_state_dicts(fetch.user_states, f"the catch-up source {fetch.plan.source_replica}")
        except (ValueError, KeyError, RuntimeError) as exc:
            raise Fatal(f"the state fetched from {fetch.plan.source_replica} does not load here: {exc}; the "
                        f"replicas run different code or settings: fix that, then restart") from None

    def _load_checkpoint(self, e: ev.LoadCheckpoint) -> None:
        s = self.settings
        if self.checkpoints is None:
            reason = "this rank has no checkpoint_dir (give every rank of the replica the same one)"
            self._queue.append(ev.CheckpointLoaded(-1, None, reason))
            return
        log.warning("replica %s rank %s: the quorum rolls back; loading the durable checkpoint of step %s instead "
                    "of training from step %s", s.replica_id, s.rank, e.step - 1, self._state.step)
        try:
            step, ledger = self.checkpoints.load(e.step)
        except LOAD_ERRORS as exc:
            self._queue.append(ev.CheckpointLoaded(-1, None, f"{exc}"))
            return
        self._queue.append(ev.CheckpointLoaded(step, ledger))

    def _apply_step(self, e: ev.ApplyStep) -> None:
        """A commit's update: the script's optimizer, learning rate × the quorum's lr_scale."""
        scaled_step(self.optimizer, e.plan.lr_scale if self.settings.apply_lr_scale else 1.0)
        if self.registry.rng is not None:
            self.registry.rng.advance()

    def _drop_gradients(self, e: ev.DropGradients) -> None:
        if self.outer is not None:
            self.outer.drop_reduce(self.sync)
        self.optimizer.zero_grad(set_to_none=True)
        self.sync.mark_broken(e.reason)  # the next attempt rebuilds the ring
        if self.registry.rng is not None:
            self.registry.rng.apply()  # the retry draws the same numbers again

    def _checkpoint(self, e: ev.Checkpoint) -> None:
        """Every rank gets this effect; fthsdp/state/replica_checkpoints.py says who writes what."""
        if self.checkpoints is None or not self.checkpoints.writes():
            return
        self.collectives.disturb()  # a write its peers may not do (in the next plan's own time)
        # a written state goes to the controller with the coordinator's next step reports
        saved = self.coordinator.checkpoint_saved if self.coordinator is not None else None
        self.checkpoints.save(e.step, e.write_state, self._state.ledger, saved)

    def _concluded(self, e: ev.Concluded) -> None:
        o = self.last_outcome = e.outcome
        self._outcomes.append(o)
        self._committed_any = self._committed_any or o.committed
        s = self.settings
        if not o.committed:
            log.warning("replica %s rank %s: step %s (attempt %s, quorum %s) will be retried: %s", s.replica_id,
                        s.rank, o.step, o.attempt, o.quorum_id, o.reason)
        elif o.behind:
            log.info("replica %s rank %s caught up and committed step %s in quorum %s", s.replica_id, s.rank,
                     o.step, o.quorum_id)

    def _closed(self, e: ev.Closed) -> None:
        level = logging.INFO if e.clean else logging.WARNING
        last = f"after step {self.step - 1}" if self.step else "before its first commit"  # as the controller says it
        log.log(level, "replica %s rank %s closed %s: %s", self.settings.replica_id, self.settings.rank, last, e.reason)

    def _fail(self, e: ev.Fail) -> None:
        error = RetryLimitExceeded if e.retries_exhausted else (
            ConfigurationError if CONFIGURATION_PREFIX in e.message else Fatal)
        raise error(e.message)

    # ------------------------------------------------------------------ checks
    def _require_not_started(self, what: str) -> None:
        if self._started:
            raise RuntimeError(f"{what} must come before Manager.start()")

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("Manager.start() must be called before the first step (and not after close()).")
        self._check_waker()

    def _require_phase(self, phase: Phase, what: str) -> None:
        self._require_started()
        if self._state.phase is not phase:
            raise ProtocolError(f"{what} while the step is {self._state.phase.name}: begin_step() (or "
                                f"FaultTolerantOptimizer.zero_grad()) first")


#: the executor: one handler per effect of the step protocol (fthsdp/step/events.py); a
#: handler may return the event to feed next
_EFFECTS: dict[type, Callable[[Manager, Any], ev.Event | None]] = {
    ev.SendBegin: Manager._send_begin,
    ev.SendVote: Manager._send_vote,
    ev.SendDigest: Manager._send_digest,
    ev.SendClose: Manager._send_close,
    ev.ServeState: Manager._serve_state,
    ev.StopServing: Manager._stop_serving,
    ev.ConfigureRing: Manager._configure_ring,
    ev.StartFetch: Manager._start_fetch,
    ev.CancelFetch: Manager._cancel_fetch,
    ev.AdoptFetched: Manager._adopt_fetched,
    ev.LoadCheckpoint: Manager._load_checkpoint,
    ev.ApplyStep: Manager._apply_step,
    **OUTER_EFFECTS,  # inner steps and syncs (fthsdp/sync/effects.py)
    ev.DropGradients: Manager._drop_gradients,
    ev.Checkpoint: Manager._checkpoint,
    ev.Concluded: Manager._concluded,
    ev.Closed: Manager._closed,
    ev.Ended: lambda m, e: log.debug("replica %s rank %s has no more steps: %s", m.settings.replica_id,
                                     m.settings.rank, e.reason),
    ev.Fail: Manager._fail,
}
Manager._EFFECTS = _EFFECTS

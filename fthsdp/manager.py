"""The Manager: one trainer process's side of the per-step protocol (docs/architecture.md).

    begin_step()      quorum (leader) + fan-out, FTAR ring, catch-up fetch when behind
    sync_gradients()  average gradients inside the replica and across replicas
    end_step()        vote, then commit (optimizer step, ledger, step + 1) or retry

`start()` does the expensive set-up -- the user's pre-init hook first, then servers,
checkpoint restore, controller connection -- before this replica reports in; the
constructor starts nothing. Errors become "no" votes; after `max_retries` failed
steps in a row `end_step` raises RetryLimitExceeded.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

from ftar_kernels import FtarEndpoint, FtarSettings
from fthsdp import retry_policy
from fthsdp.checkpoint_store import CheckpointError, CheckpointStore
from fthsdp.commit_votes import CommitDecision, Outcome, Vote
from fthsdp.controller_client import ControllerClient, ControllerError
from fthsdp.data_ledger import DataLedger, LedgerBatches
from fthsdp.gradient_sync import GradientSync, SyncResult, flatten_grads, unflatten_grads_
from fthsdp.intra_replica_channel import ChannelError, LeaderChannel, RankChannel
from fthsdp.lr_policy import lr_scale
from fthsdp.settings import RuntimeSettings
from fthsdp.state_fetch import fetch_state
from fthsdp.state_server import StateServer
from fthsdp.state_stream import Manifest, StateTarget, TransferError, build_manifest, live_entries
from fthsdp.step_plan import PlanError, QuorumView, RankPlan, plan_for_rank

log = logging.getLogger(__name__)
T = TypeVar("T")

# A test seam: called at named points ("allreduce_started", "before_vote") with the plan;
# returning a non-empty string forces a "no" vote with that reason.
FaultHook = Callable[[str, RankPlan], "str | None"]


@dataclass
class StepOutcome:
    """What happened in the last step attempt (for logs, metrics and tests)."""
    committed: bool
    step: int                 # the step trained (max_step of the quorum)
    quorum_id: int
    behind: bool
    included: tuple[str, ...]
    positions_before: dict[str, int]  # the ledger the step's batches were read from
    reason: str
    lr_scale: float = 1.0
    wait_s: float = 0.0       # time in end_step (votes, holds) beyond the gradient sync


@dataclass
class _Attempt:
    plan: RankPlan
    started_at: float
    ledger_before: DataLedger
    sync: SyncResult | None = None
    fetch_thread: threading.Thread | None = None
    fetched: Manifest | None = None
    fetch_error: str = ""
    fetch_cancelled: threading.Event = field(default_factory=threading.Event)
    faults: list[str] = field(default_factory=list)


class Manager:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: RuntimeSettings,
                 *, process_group: dist.ProcessGroup | None = None, pre_init: Callable[[], None] | None = None,
                 fault_hook: FaultHook | None = None) -> None:
        self.settings = settings.validate()
        self.model, self.optimizer = model, optimizer
        self.process_group = process_group
        self._pre_init, self._fault_hook = pre_init, fault_hook
        self.step = 0
        self.ledger = DataLedger()
        self.retry_state = retry_policy.RetryState()
        self.last_outcome: StepOutcome | None = None
        self.last_checkpoint_error = ""
        self.incarnation = uuid.uuid4().hex[:12]
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._flat: torch.Tensor | None = None
        self._attempt: _Attempt | None = None
        self._loss = 0.0
        self._tokens = 0
        self._started = False
        self.checkpoints = CheckpointStore(settings.checkpoint_dir) if settings.checkpoint_dir else None

    # ------------------------------------------------------------------ set-up

    def start(self) -> "Manager":
        s = self.settings
        if self._pre_init is not None:
            self._pre_init()
        self._restore_checkpoint()
        self.endpoint = FtarEndpoint.open(s.bind_host, 0, FtarSettings(
            chunk_bytes=s.ftar_chunk_bytes, chunks_in_flight=s.ftar_chunks_in_flight,
            timeout_s=s.allreduce_timeout_s, connect_timeout_s=min(10.0, s.allreduce_timeout_s)))
        self.sync = GradientSync(self.endpoint, s.rank, s.world_size, s.allreduce_timeout_s,
                                 self.process_group, self._allreduce_started)
        self.state_server = StateServer(s.bind_host, 0, self._snapshot, f"{s.replica_id}/{s.rank}").start()
        self.state_server.release(self.step)
        self.controller: ControllerClient | None = None
        self.leader_channel: LeaderChannel | None = None
        self.rank_channel: RankChannel | None = None
        if s.is_leader:
            host, _, port = (s.leader_address or f"{s.bind_host}:0").rpartition(":")
            self.leader_channel = LeaderChannel(host, int(port), s.world_size).start()
            self.controller = ControllerClient(s.controller_address, s.job_id, s.replica_id, self.incarnation)
            self.leader_channel.wait_for_ranks(s.quorum_timeout_s)
            self.controller.start_heartbeats(s.heartbeat_interval_s)
        else:
            self.rank_channel = RankChannel(s.leader_address, s.rank).connect(
                s.quorum_timeout_s, ftar=self.endpoint.address, state=self.state_server.address)
        self._started = True
        log.info("replica %s rank %s started at step %s", s.replica_id, s.rank, self.step)
        return self

    def close(self) -> None:
        for closer in ("controller", "leader_channel", "rank_channel", "state_server", "endpoint"):
            obj = getattr(self, closer, None)
            if obj is not None:
                try:
                    obj.close()
                except Exception as exc:  # noqa: BLE001 - closing is best effort
                    log.debug("closing %s failed: %r", closer, exc)

    def _restore_checkpoint(self) -> None:
        if self.checkpoints is None:
            return
        latest = self.checkpoints.latest_complete()
        if latest is None:
            return
        restored = self.checkpoints.load(latest)
        self.model.load_state_dict(restored.model_state)
        self.optimizer.load_state_dict(restored.optimizer_state)
        self.step, self.ledger = restored.step, DataLedger.from_json(restored.ledger_json)
        log.info("replica %s rank %s resumed from checkpoint %s at step %s", self.settings.replica_id,
                 self.settings.rank, restored.path, self.step)

    def _snapshot(self):
        entries, scalars = live_entries(self.model, self.optimizer)
        return build_manifest(self.step, self.ledger.to_json(), entries, scalars), [t for _, t in entries]

    # ------------------------------------------------------------------ data

    def batches(self, batch_at: Callable[[str, int], T]) -> LedgerBatches[T]:
        """Endless batches of this replica's stream at its ledger position (exactly once)."""
        return LedgerBatches(lambda: self.ledger, self.settings.replica_id, batch_at)

    @property
    def is_behind(self) -> bool:
        """True while this step only catches up (its forward/backward will be discarded)."""
        return self._attempt is not None and self._attempt.plan.behind

    # ------------------------------------------------------------------ the step

    def begin_step(self) -> RankPlan:
        if not self._started:
            raise RuntimeError("Manager.start() must be called before the first step.")
        s = self.settings
        view = self._receive_view()
        plan = plan_for_rank(view, s.job_id, s.replica_id, s.rank)
        if not plan.behind and plan.step != self.step:
            raise PlanError(f"quorum {plan.quorum_id} calls replica {s.replica_id} healthy at step "
                            f"{plan.step} but it is at step {self.step}")
        attempt = _Attempt(plan, time.monotonic(), self.ledger)
        self._attempt = attempt
        if plan.behind:  # fetch in the background; this step contributes zeros meanwhile
            self.state_server.hold_for_fetchers(self.step, set(), 0.0)  # our state is stale now
            attempt.fetch_thread = threading.Thread(target=self._fetch, args=(attempt,), daemon=True,
                                                    name=f"catch-up-{s.replica_id}-{s.rank}")
            attempt.fetch_thread.start()
        self.sync.configure(plan)
        return plan

    def _receive_view(self) -> QuorumView:
        s = self.settings
        if s.is_leader:
            assert self.controller is not None and self.leader_channel is not None
            try:
                view = self.controller.quorum(
                    self.step, s.world_size, self._addresses("ftar"), self._addresses("state"),
                    self.leader_channel.address, s.quorum_timeout_s)
            except ControllerError as exc:
                self.leader_channel.broadcast({"t": "plan", "error": str(exc)})
                raise
            self.leader_channel.broadcast({"t": "plan", "view": view.to_json()})
            return view
        assert self.rank_channel is not None
        msg = self.rank_channel.recv(s.quorum_timeout_s + s.vote_timeout_s)
        if msg.get("t") != "plan":
            raise ChannelError(f"rank {s.rank} expected a plan from its leader, got {msg.get('t')!r}")
        if "error" in msg:
            raise ControllerError(f"the leader could not get a quorum: {msg['error']}")
        return QuorumView.from_json(msg["view"])

    def _addresses(self, kind: str) -> list[str]:
        """Every rank's address of `kind` ("ftar" or "state"); ranks sent theirs in their hello."""
        assert self.leader_channel is not None
        mine = {"ftar": self.endpoint.address, "state": self.state_server.address}[kind]
        return [mine] + [str(self.leader_channel.hellos[r][kind]) for r in range(1, self.settings.world_size)]

    def _fetch(self, attempt: _Attempt) -> None:
        s, plan = self.settings, attempt.plan
        try:
            attempt.fetched = fetch_state(plan.fetch_from, plan.step, s.replica_id,
                                          lambda: StateTarget(self.model, self.optimizer),
                                          s.fetch_timeout_s, s.fetch_attempts, attempt.fetch_cancelled.is_set)
        except TransferError as exc:
            attempt.fetch_error = f"catch-up from {plan.source_replica} failed: {exc}"

    def _allreduce_started(self, plan: RankPlan) -> None:
        if self._fault_hook is not None and self._attempt is not None:
            forced = self._fault_hook("allreduce_started", plan)
            if forced:
                self._attempt.faults.append(forced)

    def sync_gradients(self, loss: float | None = None) -> SyncResult:
        """Average the parameters' gradients for this step (in place). Call after backward."""
        attempt = self._require_attempt()
        if loss is not None:
            self._loss = float(loss)
        self._flat = flatten_grads(self._params, self._flat)
        attempt.sync = self.sync.reduce_(self._flat, attempt.plan)
        unflatten_grads_(self._params, self._flat)
        return attempt.sync

    def reduce_bucket_(self, bucket: torch.Tensor) -> SyncResult:
        """For the DDP communication hook: average one gradient bucket in place."""
        attempt = self._require_attempt()
        result = self.sync.reduce_(bucket, attempt.plan)
        if attempt.sync is None or attempt.sync.ok:
            attempt.sync = result
        return result

    def _require_attempt(self) -> _Attempt:
        if self._attempt is None:
            raise RuntimeError("begin_step() (or FaultTolerantOptimizer.zero_grad()) must come first.")
        return self._attempt

    def end_step(self, loss: float | None = None, tokens: int = 0) -> bool:
        """Vote, then commit or retry. Returns True when the step committed.
        `loss` and `tokens` only go into the leader's report to the controller."""
        attempt = self._require_attempt()
        if loss is not None:
            self._loss = float(loss)
        self._tokens = tokens
        s, plan = self.settings, attempt.plan
        if attempt.sync is None:
            self.sync_gradients()
        t0 = time.monotonic()
        reason = self._local_verdict(attempt)
        decision = self._agree(Vote(s.rank, plan.quorum_id, plan.step, not reason, reason))
        if decision.outcome is Outcome.COMMIT:
            self._commit(attempt)
        else:
            self._retry(attempt, decision)
        assert self.last_outcome is not None
        self.last_outcome.wait_s = time.monotonic() - t0
        self._attempt = None
        if decision.outcome is not Outcome.COMMIT:
            self.retry_state, give_up = retry_policy.after_failure(self.retry_state, decision.reason,
                                                                   s.max_retries)
            if give_up:
                raise retry_policy.RetryLimitExceeded(
                    retry_policy.give_up_message(self.retry_state, s.max_retries, plan.step))
            return False
        self.retry_state = retry_policy.after_commit(self.retry_state)
        return True

    def _local_verdict(self, attempt: _Attempt) -> str:
        """Empty when this rank can commit; otherwise why not (errors become votes)."""
        s = self.settings
        if attempt.fetch_thread is not None:
            attempt.fetch_thread.join(s.fetch_timeout_s * s.fetch_attempts)
            if attempt.fetch_thread.is_alive():
                attempt.fetch_cancelled.set()  # it must not load anything into a later step
                attempt.fetch_thread.join(s.fetch_timeout_s)
                return "catch-up fetch did not finish in time"
            if attempt.fetch_error:
                return attempt.fetch_error
        if attempt.sync is not None and not attempt.sync.ok:
            return attempt.sync.reason
        if attempt.faults:
            return attempt.faults[0]
        if self._fault_hook is not None:
            forced = self._fault_hook("before_vote", attempt.plan)
            if forced:
                return forced
        return ""

    def _agree(self, own: Vote) -> CommitDecision:
        s = self.settings
        if s.is_leader:
            assert self.leader_channel is not None
            decision = self.leader_channel.collect_votes(own.quorum_id, own.step, own, s.vote_timeout_s)
            self.leader_channel.broadcast({"t": "decision", "quorum_id": own.quorum_id, "step": own.step,
                                           "outcome": decision.outcome.value, "reason": decision.reason})
            return decision
        assert self.rank_channel is not None
        self.rank_channel.send({"t": "vote", "rank": own.rank, "quorum_id": own.quorum_id, "step": own.step,
                                "ok": own.ok, "reason": own.reason})
        msg = self.rank_channel.recv(s.vote_timeout_s * 2)
        if msg.get("t") != "decision" or (msg.get("quorum_id"), msg.get("step")) != (own.quorum_id, own.step):
            raise ChannelError(f"rank {s.rank} expected the decision on quorum {own.quorum_id} step "
                               f"{own.step}, got {msg}")
        return CommitDecision(Outcome(msg["outcome"]), str(msg.get("reason", "")))

    def _commit(self, attempt: _Attempt) -> None:
        s, plan = self.settings, attempt.plan
        # The source holds its optimizer step until its fetchers have their copy (bounded).
        self.state_server.hold_for_fetchers(plan.step, set(plan.fetchers), s.fetch_hold_timeout_s)
        base = attempt.fetched.ledger_json if attempt.fetched is not None else None
        ledger_before = DataLedger.from_json(base) if base is not None else attempt.ledger_before
        scale = lr_scale(s.lr_policy, plan.healthy_count, plan.total_replicas, plan.lr_scale_from_quorum)
        user_lrs = [g["lr"] for g in self.optimizer.param_groups]
        for group, lr in zip(self.optimizer.param_groups, user_lrs):
            group["lr"] = lr * scale
        try:
            self.optimizer.step()
        finally:
            for group, lr in zip(self.optimizer.param_groups, user_lrs):
                group["lr"] = lr
        self.ledger = ledger_before.advanced(plan.included)
        self.step = plan.step + 1
        self.state_server.release(self.step)
        self.last_outcome = StepOutcome(True, plan.step, plan.quorum_id, plan.behind, plan.included,
                                        dict(ledger_before.positions), "committed", scale)
        if plan.behind:
            log.info("replica %s rank %s caught up from %s and committed step %s in quorum %s",
                     s.replica_id, s.rank, plan.source_replica, plan.step, plan.quorum_id)
        if s.is_leader and self.controller is not None:
            self.controller.report_step(plan.quorum_id, plan.step, time.monotonic() - attempt.started_at,
                                        self._loss, self._tokens)
        self._maybe_checkpoint(plan)

    def _retry(self, attempt: _Attempt, decision: CommitDecision) -> None:
        s, plan = self.settings, attempt.plan
        self.optimizer.zero_grad(set_to_none=True)
        self.sync.mark_broken(decision.reason)  # the next quorum has a new id; rebuild the ring
        if not plan.behind:
            self.state_server.release(self.step)
        self.last_outcome = StepOutcome(False, plan.step, plan.quorum_id, plan.behind, plan.included,
                                        dict(attempt.ledger_before.positions), decision.reason)
        log.warning("replica %s rank %s: step %s of quorum %s will be retried: %s", s.replica_id, s.rank,
                    plan.step, plan.quorum_id, decision.reason)
        if s.is_leader and self.controller is not None:
            self.controller.report_failure(plan.quorum_id, plan.step, decision.reason)

    def _maybe_checkpoint(self, plan: RankPlan) -> None:
        s = self.settings
        if self.checkpoints is None or s.checkpoint_every_steps <= 0 or self.step % s.checkpoint_every_steps:
            return
        try:
            if s.is_leader and plan.included and plan.included[0] == s.replica_id:
                self.checkpoints.save_state(self.step, self.ledger.to_json(), self.model, self.optimizer)
            if s.is_leader:
                self.checkpoints.save_ledger_entry(self.step, s.replica_id, self.ledger.position(s.replica_id))
            self.last_checkpoint_error = ""
        except CheckpointError as exc:
            self.last_checkpoint_error = str(exc)
            log.error("replica %s: %s; training continues without this checkpoint", s.replica_id, exc)

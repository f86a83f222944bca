"""One replica rank's side of durable checkpoints: where it resumes at start, what it loads on a
rollback, what it writes when the protocol says so. The store (fthsdp/state/checkpoint.py) holds
the files; this holds who reads and writes them together and what the Manager does with errors.

A sharded model's ranks write and read together (DCP is collective over them); a replicated
model's state is whole on each rank, and rank 0 alone writes it and the replica's ledger entry.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.distributed as dist

from fthsdp.data_ledger import DataLedger
from fthsdp.errors import CheckpointError, Fatal
from fthsdp.settings import RuntimeSettings
from fthsdp.state import shards
from fthsdp.state.checkpoint import CheckpointStore
from fthsdp.state.registry import StateRegistry

log = logging.getLogger(__name__)
#: what a checkpoint that does not load raises (besides CheckpointError)
LOAD_ERRORS = (CheckpointError, ValueError, RuntimeError, KeyError)


class ReplicaCheckpoints:
    def __init__(self, store: CheckpointStore, settings: RuntimeSettings, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, registry: StateRegistry, *, sharded: bool,
                 process_group: dist.ProcessGroup | None) -> None:
        self.store, self.settings = store, settings
        self.model, self.optimizer, self.registry = model, optimizer, registry
        self.sharded, self.process_group = sharded, process_group
        #: why the last write failed ("" after a good one); training goes on without it
        self.last_error = ""

    def group(self) -> dist.ProcessGroup | None:
        """Who writes and reads a checkpoint together: a sharded model's ranks; None when the
        state is whole on each rank."""
        return shards.process_group_of(self.model) if self.sharded else None

    def resume_point(self) -> tuple[int, DataLedger] | None:
        """Load the newest checkpoint every rank of the replica holds complete and signed (they
        agree on the lowest), and return the step it starts and its ledger; None: none."""
        s = self.settings
        group = self.group() if self.sharded else self.process_group
        mine = self.store.latest_complete()
        passed_over = [step for step in self.store.steps() if mine is None or step > mine]
        if passed_over:
            log.warning("checkpoints of steps %s in %s are incomplete, damaged or not signed with this job's "
                        "secret: not resumed from", passed_over, s.checkpoint_dir)
        latest = shards.agree_on_min(mine, group if s.world_size > 1 else None)
        if latest is None:
            return None
        try:
            return self.load(latest)
        except LOAD_ERRORS as exc:
            raise Fatal(f"cannot resume from checkpoint step {latest} in {s.checkpoint_dir}: {exc}; "
                        f"move that step's folder away (an older one is used) or fix the script") from None

    def load(self, step: int) -> tuple[int, DataLedger]:
        """Load the checkpoint of the state at the start of `step` into the model, the optimizer
        and the registered state; returns the step it starts and its ledger."""
        restored = self.store.load(step, self.model, self.optimizer, self.group())
        self.registry.load_state_dicts(restored.user_states, f"checkpoint {restored.path}")
        log.info("replica %s rank %s loaded checkpoint %s: at step %s", self.settings.replica_id,
                 self.settings.rank, restored.path, restored.step)
        return restored.step, DataLedger.from_json(restored.ledger_json)

    def writes(self) -> bool:
        """Whether this rank writes anything: every rank of a sharded model, rank 0 otherwise."""
        return self.settings.rank == 0 or self.sharded

    def save(self, step: int, write_state: bool, ledger: DataLedger, saved: Callable[[int], None] | None) -> None:
        """Write the state at the start of `step` (when `write_state`) and, on rank 0, the
        replica's ledger entry; `saved(step - 1)` is told of a written state. A failed write
        is logged and kept in `last_error`: training continues without it."""
        s = self.settings
        try:
            if write_state:
                self.store.save_state(step, ledger.to_json(), self.model, self.optimizer,
                                      self.registry.state_dicts(), process_group=self.group(), rank=s.rank)
                if saved is not None:
                    saved(step - 1)
            if s.rank == 0:
                self.store.save_ledger_entry(step, s.replica_id, ledger.position(s.replica_id))
            self.last_error = ""
        except CheckpointError as exc:
            self.last_error = str(exc)
            log.error("replica %s: %s; training continues without this checkpoint", s.replica_id, exc)

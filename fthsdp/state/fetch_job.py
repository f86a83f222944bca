"""One catch-up fetch on a background thread, while the training thread contributes zeros.

The thread streams the source's state into this rank's model tensors and the optimizer
tensors it holds, in place, and stages the rest (fthsdp/state/fetch.py), decodes the
registered state's payloads (safe loading), and then writes one byte to a pipe: the Manager
waits on that pipe and the coordinator's socket at once, and turns the result into the
protocol's FetchFinished event. `cancel` stops the thread between parts (bounded), so
nothing is written into the tensors afterwards.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from fthsdp.data_ledger import DataLedger
from fthsdp.errors import TransferError
from fthsdp.settings import RuntimeSettings
from fthsdp.state.fetch import fetch_state
from fthsdp.state.registry import MAX_PAYLOAD_BYTES, StateRegistry
from fthsdp.state.stream import Fetched, StateTarget
from fthsdp.step.events import FetchFinished
from fthsdp.step.plan import RankPlan
from protos import job_secret


class FetchJob:
    def __init__(self, plan: RankPlan, settings: RuntimeSettings, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, registry: StateRegistry) -> None:
        self.plan, self.settings = plan, settings
        self._registry = registry
        self._target = StateTarget(model, optimizer, registry.names, MAX_PAYLOAD_BYTES)  # on the training thread
        self._cancelled = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"catch-up-{settings.replica_id}-{settings.rank}")
        self.done = False
        self.reported = False          # the Manager fed its FetchFinished
        self.fetched: Fetched | None = None
        self.user_states: dict[str, Any] = {}
        self.ledger: DataLedger | None = None
        self.error = ""

    @property
    def wake_fd(self) -> int:
        return self._read_fd

    def start(self) -> "FetchJob":
        self._thread.start()
        return self

    def _run(self) -> None:
        s, plan = self.settings, self.plan
        try:
            fetched = fetch_state(plan.fetch_from, plan.step, s.replica_id, self._target.fresh,
                                  s.fetch_timeout_s, s.fetch_attempts, self._cancelled.is_set,
                                  key=s.port_key(job_secret.PURPOSE_STATE))
            self.user_states = self._registry.decode(fetched.user_payloads)
            self.ledger = DataLedger.from_json(fetched.manifest.ledger_json)
            self.fetched = fetched
        except (TransferError, ValueError) as exc:
            self.error = f"catch-up from {plan.source_replica} ({plan.fetch_from}) failed: {exc}"
        finally:
            self.done = True
            os.write(self._write_fd, b"x")  # the fds stay open until the thread is done (close())

    def event(self) -> FetchFinished:
        if self.fetched is not None:
            return FetchFinished(True, "", self.ledger)
        return FetchFinished(False, self.error or "catch-up fetch failed")

    def cancel(self, timeout_s: float) -> None:
        """Stop the fetch (it checks between pieces) and wait for it, at most timeout_s."""
        self._cancelled.set()
        self._thread.join(timeout_s)
        self.close()

    def close(self) -> None:
        """Release the pipe once the thread is done (a thread still running keeps it)."""
        if self._thread.is_alive() or self._read_fd < 0:
            return
        os.close(self._read_fd)
        os.close(self._write_fd)
        self._read_fd = self._write_fd = -1

"""fthsdp: the fault-tolerant HSDP trainer runtime (and the `fthsdp` command line).

    from fthsdp import Manager, RuntimeSettings, FaultTolerantOptimizer

Names are imported lazily so that `fthsdp controller` (which imports this package for
its CLI) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Manager": "fthsdp.manager",
    "Seams": "fthsdp.manager",
    "StepOutcome": "fthsdp.step.events",
    "RuntimeSettings": "fthsdp.settings",
    "FaultTolerantOptimizer": "fthsdp.optimizer_wrapper",
    "ddp_comm_hook": "fthsdp.optimizer_wrapper",
    "DataLedger": "fthsdp.data_ledger",
    "Recoverable": "fthsdp.errors",
    "Fatal": "fthsdp.errors",
    "RetryLimitExceeded": "fthsdp.errors",
    "ReplicaFinished": "fthsdp.errors",
    "JobAlreadyCompleted": "fthsdp.errors",
    "JobFailed": "fthsdp.errors",
    "ConfigurationError": "fthsdp.errors",
    "EXIT_JOB_ALREADY_COMPLETED": "fthsdp.errors",
    "EXIT_CONFIGURATION_ERROR": "fthsdp.errors",
    "exit_status": "fthsdp.errors",
    "CheckpointStore": "fthsdp.state.checkpoint",
    "CheckpointError": "fthsdp.errors",
    "state_digest": "fthsdp.state.digest",
    # A warm spare's trainer: set up, then wait for the agent's hand-over (agent/env.py).
    "is_standby": "agent.env",
    "wait_for_assignment": "agent.env",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fthsdp' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

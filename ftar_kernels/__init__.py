"""FTAR: a fault-tolerant ring all-reduce with a CPU control plane, reconfigurable without restarts.

Imports nothing else of this project. Names are imported lazily, so `ftar_kernels.auth` (the
message tags other ports reuse) costs no torch import; CuPy is imported only when a CUDA tensor
is all-reduced.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FtarEndpoint": ".endpoint",
    "FatalError": ".errors", "FtarError": ".errors", "NotReady": ".errors", "RecoverableError": ".errors",
    "Faults": ".fault_injection", "FaultyTransport": ".fault_injection",
    "AllReduceHandle": ".op_handle", "OpStats": ".op_handle",
    "IllegalTransition": ".protocol_state", "RankEvent": ".protocol_state", "RankProtocol": ".protocol_state",
    "RankState": ".protocol_state",
    "FtarSettings": ".settings",
    "Connection": ".transport", "Listener": ".transport", "TcpTransport": ".transport", "Transport": ".transport",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ftar_kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)

"""FTAR: a fault-tolerant ring all-reduce with a CPU control plane, reconfigurable without restarts.

Imports nothing else of this project. CuPy is imported only when a CUDA tensor is all-reduced.
"""

from .endpoint import FtarEndpoint
from .errors import FatalError, FtarError, RecoverableError
from .fault_injection import Faults, FaultyTransport
from .op_handle import AllReduceHandle, OpStats
from .protocol_state import IllegalTransition, RankEvent, RankProtocol, RankState
from .settings import FtarSettings
from .transport import Connection, Listener, TcpTransport, Transport

__all__ = [
    "AllReduceHandle", "Connection", "FatalError", "Faults", "FaultyTransport", "FtarEndpoint",
    "FtarError", "FtarSettings", "IllegalTransition", "Listener", "OpStats", "RankEvent",
    "RankProtocol", "RankState", "RecoverableError", "TcpTransport", "Transport",
]

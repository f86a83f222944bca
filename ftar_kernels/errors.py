"""The two kinds of FTAR error, retry after reconfiguring or give up, and their named cases.

`RecoverableError`: a peer timed out, reset, refused or closed a connection, a queued operation
was cancelled, or the endpoint is not configured. The process and its tensors stay usable; the
caller drops the step's gradients, reconfigures (new generation) and tries again.

`FatalError`: the peers disagree on what is being reduced (size, dtype, op, sequence), an argument
is invalid, or the local device failed. Retrying cannot help; the process should exit and be
replaced.

Named cases: `NotReady` (a RecoverableError) is an all-reduce asked for in a state whose table
row refuses it (not configured, connecting, aborted, closed); `protocol_state.IllegalTransition`
(a FatalError) is any other event the table refuses, such as configure() after close().
"""

from __future__ import annotations


class FtarError(Exception):
    """Base class of every error FTAR raises on purpose."""


class RecoverableError(FtarError):
    """Reconfigure and retry: a peer or the network failed, this process is fine."""


class FatalError(FtarError):
    """Do not retry: the request or this process is broken."""


_NOT_READY_WHY = {
    "idle": "is not configured; call configure() first",
    "connecting": "is connecting a new generation; all-reduce once configure() has returned",
    "aborted": "aborted its generation after a failure; reconfigure first",
    "closed": "is closed",
}


class NotReady(RecoverableError):
    """An all-reduce was asked for in a state whose table row refuses `submit`.

    `state` is the RankState's value ("idle", "connecting", "aborted" or "closed")."""

    def __init__(self, address: str, state, generation: int | None) -> None:
        self.state = getattr(state, "value", state)
        why = _NOT_READY_WHY.get(self.state, f"is in state {self.state!r}")
        super().__init__(f"FTAR endpoint {address} (generation {generation}) {why}; "
                         f"the protocol table refuses 'submit' in state {self.state!r}")

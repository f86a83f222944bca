"""The two kinds of FTAR error: retry after reconfiguring, or give up.

`RecoverableError`: a peer timed out, reset, refused or closed a connection, a queued operation
was cancelled, or the endpoint is not configured. The process and its tensors stay usable; the
caller drops the step's gradients, reconfigures (new generation) and tries again.

`FatalError`: the peers disagree on what is being reduced (size, dtype, op, sequence), an argument
is invalid, or the local device failed. Retrying cannot help; the process should exit and be
replaced.
"""

from __future__ import annotations


class FtarError(Exception):
    """Base class of every error FTAR raises on purpose."""


class RecoverableError(FtarError):
    """Reconfigure and retry: a peer or the network failed, this process is fine."""


class FatalError(FtarError):
    """Do not retry: the request or this process is broken."""

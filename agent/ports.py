"""The ports an agent registers for its host: where a replica's rank 0 would listen here.

Rank 0 of a replica runs the torch.distributed rendezvous store (MASTER_PORT; it listens on
every interface) and the replica's coordinator. In a pod the defaults of torchrun would do,
but hosts that share one network namespace (several agents on one machine, as in the tests)
must not share them. So unless given (`--rendezvous-port`, `--coordinator-port`), the agent
picks ports that are free when it starts, below the kernel's ephemeral range: ports that
outgoing connections and port-0 listeners (FTAR, the state server) are never handed; and below
the window the demo's trainers and the benchmarks take theirs from (protos/local_ports.py).
"""

from __future__ import annotations

import random

from protos.local_ports import ephemeral_low, is_free, window

#: The lowest port picked; the highest is one below the window of ports the demo and the
#: benchmarks hand out (protos/local_ports.py), itself below the ephemeral range.
LOWEST_PORT = 20000
_TRIES = 200


def highest_port() -> int:
    """The highest port picked: below the demo's and the benchmarks' window, else below the ephemeral range."""
    ports = window()
    return ports.start - 1 if ports else ephemeral_low() - 1


def pick_ports(count: int, avoid: frozenset[int] = frozenset(), rng: random.Random | None = None) -> list[int]:
    """`count` distinct free ports from LOWEST_PORT up to `highest_port()`, none in `avoid`;
    OSError when they are not found in a bounded number of tries."""
    rng = rng or random.Random()
    high = max(highest_port(), LOWEST_PORT + count)
    found: list[int] = []
    for _ in range(_TRIES if count else 0):
        port = rng.randint(LOWEST_PORT, high)
        if port not in found and port not in avoid and is_free(port):
            found.append(port)
            if len(found) == count:
                return found
    if len(found) == count:
        return found
    raise OSError(f"found only {len(found)} of {count} free ports in {LOWEST_PORT}..{high} after {_TRIES} tries")

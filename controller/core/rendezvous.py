"""Where the ranks of a replica meet: its rank-0 host's address and ports. Pure.

Every agent registers where other hosts reach its trainers (`address`, the pod IP) and two
ports on it: the torch.distributed rendezvous (torchrun's MASTER_PORT) and the replica's
coordinator. The host that holds rank 0 of a replica is where that replica's ranks meet, so
every rank of the replica is sent that host's `address:rendezvous_port` (as MASTER_ADDR and
MASTER_PORT) and `address:coordinator_port`. A host that registered no address gives none:
its replica's ranks are told nothing (a replica on one host meets on loopback, the agent's
business).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.checks import check_address, check_int_range, shown
from controller.core.errors import InvalidArgument

PORTS = (1, 65535)


@dataclass(frozen=True)
class Endpoints:
    rendezvous: str = ""
    coordinator: str = ""


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def endpoints(address: str, rendezvous_port: int, coordinator_port: int) -> Endpoints:
    if not address:
        return Endpoints()
    return Endpoints(host_port(address, rendezvous_port), host_port(address, coordinator_port))


def check_host_address(address: str, rendezvous_port: int, coordinator_port: int,
                       max_chars: int) -> tuple[str, int, int]:
    """A registered address (a host name or IP, no port) and its two ports; raises
    InvalidArgument naming the bad value. Without an address the ports are ignored (0)."""
    if not address:
        return "", 0, 0
    check_address("address", address, max_chars)
    if any(c in address for c in "/[]") or address.count(":") == 1:
        raise InvalidArgument(f"address must be a host name or IP address without a port or brackets (the "
                              f"ports are rendezvous_port and coordinator_port), got {shown(address)}.")
    check_int_range("rendezvous_port", rendezvous_port, *PORTS)
    check_int_range("coordinator_port", coordinator_port, *PORTS)
    if rendezvous_port == coordinator_port:
        raise InvalidArgument(f"rendezvous_port and coordinator_port must differ, both are {rendezvous_port}.")
    return address, rendezvous_port, coordinator_port

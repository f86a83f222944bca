"""A host's requests checked before they change anything (RequestError names the bad field),
and the one line that announces a batch of orders. Pure."""

from __future__ import annotations

from controller.core.checks import check_id, check_int_range, check_non_negative, check_ranks
from controller.core.errors import InvalidArgument
from controller.core.model import Assignment, Host, OrderOut
from controller.core.rendezvous import check_host_address
from controller.core.roles import reconcile_spare_claim

MAX_LABELS = 32
#: Exit codes are 0..255; -1 means "killed by a signal". Signals are 1..127.
EXIT_CODES = (-1, 255)
SIGNALS = (0, 127)


def checked_registration(s, known: Host | None, host_id, incarnation, slots, labels, assignment, spare, address,
                         rendezvous_port, coordinator_port, previous_secret):
    """A registration's fields checked against settings `s` (`known`: the host's record, if
    any); returns the labels, assignment, spare flag, address and ports to use."""
    check_id("host_id", host_id, s.max_id_chars)
    check_id("incarnation", incarnation, s.max_id_chars)
    check_int_range("slots", slots, 0, s.max_slots_per_host)
    address, rendezvous_port, coordinator_port = check_host_address(
        address, rendezvous_port, coordinator_port, s.max_address_chars)
    if len(previous_secret) > s.max_id_chars:
        raise InvalidArgument(f"previous_secret is {len(previous_secret)} characters; the limit is {s.max_id_chars}.")
    if len(labels or {}) > MAX_LABELS:
        raise InvalidArgument(f"host {host_id} sent {len(labels)} labels; the limit is {MAX_LABELS}.")
    labels = dict(labels or {})
    for k, v in labels.items():
        check_id("label key", k, s.max_id_chars)
        if len(v) > s.max_id_chars or not v.isprintable():
            raise InvalidArgument(f"label {k}={v[:40]!r} must be at most {s.max_id_chars} printable "
                                  f"characters, got {len(v)}.")
    if assignment is not None:
        check_id("assignment replica_id", assignment.replica_id, s.max_id_chars)
        assignment = Assignment(assignment.replica_id, check_ranks(
            assignment.ranks, assignment.world_size, s.max_world_size, s.max_slots_per_host),
            assignment.world_size)
        if spare:  # a spare that was given work: the durable record decides (controller.core.roles)
            assignment, spare = reconcile_spare_claim(assignment, known)
    return labels, assignment, spare, address, rendezvous_port, coordinator_port


def check_exit(s, replica_id: str, exit_code: int, signal: int, version: int) -> None:
    """A trainer exit's fields checked against settings `s`."""
    check_id("replica_id", replica_id, s.max_id_chars)
    check_int_range("exit_code", exit_code, *EXIT_CODES)
    check_int_range("signal", signal, *SIGNALS)
    check_non_negative("version", version)


def orders_summary(orders: list[OrderOut]) -> str:
    """One line for a batch of orders (a replica of 1,000 hosts is restarted by one line,
    not 1,000)."""
    restarts = [o for o in orders if o.kind == "RESTART"]
    parts = [f"{o.kind} to host {o.host_id}" + (f" ({o.assignment.describe()})" if o.assignment else "")
             for o in orders if o.kind != "RESTART"]
    if restarts:
        parts.append(f"RESTART to {len(restarts)} host(s) of replica {restarts[0].assignment.replica_id}")
    return f"orders {orders[0].order_id}..{orders[-1].order_id}: {'; '.join(parts)}"


def free_slot(s, holder) -> Assignment | None:
    """The first host slot of the controller's own layout (settings `s`) that nobody holds
    (`holder(slot)`: who holds any of its ranks, or None)."""
    world = s.hosts_per_replica * s.ranks_per_host
    for i in range(s.replicas if s.hosts_per_replica else 0):
        for k in range(s.hosts_per_replica):
            slot = Assignment(f"r{i}", tuple(range(k * s.ranks_per_host, (k + 1) * s.ranks_per_host)), world)
            if holder(slot) is None:
                return slot
    return None

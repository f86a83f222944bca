"""Validation of request fields; every message names the bad value."""

from __future__ import annotations

import re

from controller.core.errors import InvalidArgument

#: Identifiers (jobs, replicas, hosts, incarnations, label keys): what Kubernetes names and
#: host names use, plus a few separators. The status API documents the same pattern.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$"
_ID = re.compile(ID_PATTERN)


def check_id(kind: str, value: str, max_chars: int) -> str:
    if not value:
        raise InvalidArgument(f"{kind} must not be empty.")
    if len(value) > max_chars:
        raise InvalidArgument(f"{kind} {value[:40]!r}… is {len(value)} characters; the limit is {max_chars}.")
    if not _ID.match(value):
        raise InvalidArgument(
            f"{kind} {value!r} must start with a letter or digit and hold only letters, digits and ._:@/+=-"
        )
    return value


def check_non_negative(kind: str, value: int) -> int:
    if value < 0:
        raise InvalidArgument(f"{kind} must not be negative, got {value}.")
    return value


def check_addresses(kind: str, addresses, world_size: int, max_chars: int) -> tuple[str, ...]:
    addresses = tuple(addresses)
    if addresses and len(addresses) != world_size:
        raise InvalidArgument(
            f"{kind} has {len(addresses)} entries but world_size is {world_size}; send one per rank or none."
        )
    for i, a in enumerate(addresses):
        if not a or len(a) > max_chars:
            raise InvalidArgument(f"{kind}[{i}] {a[:40]!r} must be 1..{max_chars} characters.")
    return addresses


def check_ranks(ranks, world_size: int) -> tuple[int, ...]:
    ranks = tuple(ranks)
    if world_size < 1:
        raise InvalidArgument(f"assignment world_size must be at least 1, got {world_size}.")
    if not ranks:
        raise InvalidArgument("assignment names no ranks.")
    if len(set(ranks)) != len(ranks):
        raise InvalidArgument(f"assignment ranks {list(ranks)} contain duplicates.")
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise InvalidArgument(f"assignment ranks {bad} are outside 0..{world_size - 1}.")
    return ranks

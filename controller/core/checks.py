"""Validation of request fields; every message names the bad value.

The bounds, in one place (the wire contract's comments say the same):
- identifiers (job, replica, host, incarnation, label key, order id): 1..max_id_chars of
  ID_PATTERN; label values at most max_id_chars;
- addresses: 1..max_address_chars of printable ASCII without spaces;
- integers on the wire (steps, quorum ids, tokens): 0..MAX_INT, so JSON readers that hold
  numbers as doubles see them exactly; floats must be finite;
- free text from clients (reasons, errors, stderr tails) is never refused for its length: it is
  cut to max_reason_chars with a marker saying how much was cut (`clip_text`); characters that
  are not printable become spaces (a log line stays one line) and characters beyond the Basic
  Multilingual Plane become U+FFFD, so one character takes at most JSON_BYTES_PER_CHAR bytes
  in the store. Cordon reasons are cut to MAX_CORDON_REASON_CHARS.
"""

from __future__ import annotations

import math
import re

from controller.core.errors import InvalidArgument

#: Identifiers (jobs, replicas, hosts, incarnations, label keys): what Kubernetes names and
#: host names use, plus a few separators. The status API documents the same pattern.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$"
_ID = re.compile(ID_PATTERN)
#: Addresses: host:port, [v6]:port or a URL; printable ASCII, no spaces.
_ADDRESS = re.compile(r"^[\x21-\x7e]+$")
#: The largest integer a JSON reader holding numbers as doubles sees exactly (2**53 - 1).
MAX_INT = (1 << 53) - 1
#: The most bytes one character of clipped text takes in the store's JSON ("\\u20ac").
JSON_BYTES_PER_CHAR = 6
#: Cordon reasons (an operator's, or the failure that caused the cordon) are cut to this.
MAX_CORDON_REASON_CHARS = 512
#: How a cut text ends; {n} is the number of characters cut.
CUT_MARKER = "…[{n} more characters cut]"


def shown(value: str) -> str:
    """A value for an error message: quoted, and cut after 40 characters."""
    return repr(value[:40]) + ("…" if len(value) > 40 else "")


def check_id(kind: str, value: str, max_chars: int) -> str:
    if not value:
        raise InvalidArgument(f"{kind} must not be empty.")
    if len(value) > max_chars:
        raise InvalidArgument(f"{kind} {shown(value)} is {len(value)} characters; the limit is {max_chars}.")
    if not _ID.match(value):
        raise InvalidArgument(
            f"{kind} {value!r} must start with a letter or digit and hold only letters, digits and ._:@/+=-"
        )
    return value


def check_optional_id(kind: str, value: str, max_chars: int) -> str:
    """An identifier that may be left empty (e.g. an incarnation a simple client omits)."""
    return check_id(kind, value, max_chars) if value else value


def check_non_negative(kind: str, value: int) -> int:
    if value < 0:
        raise InvalidArgument(f"{kind} must not be negative, got {value}.")
    if value > MAX_INT:
        raise InvalidArgument(f"{kind} {value} is larger than the limit {MAX_INT} (2**53 - 1).")
    return value


def check_int_range(kind: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(f"{kind} must be {low}..{high}, got {value}.")
    return value


def check_finite(kind: str, value: float, *, non_negative: bool = False) -> float:
    if not math.isfinite(value):
        raise InvalidArgument(f"{kind} must be a finite number, got {value}.")
    if non_negative and value < 0:
        raise InvalidArgument(f"{kind} must not be negative, got {value}.")
    return value


def clip_text(value: str, max_chars: int) -> str:
    """Free text, bounded: longer than `max_chars` is cut and ends with CUT_MARKER (the result
    is at most `max_chars` long); unprintable characters become spaces."""
    if len(value) > max_chars:
        cut = len(value) - max_chars
        while True:  # the marker's own length depends on the count it shows: settle it
            kept = max_chars - len(CUT_MARKER.format(n=cut))
            if len(value) - kept == cut:
                break
            cut = len(value) - kept
        value = value[:kept] + CUT_MARKER.format(n=cut)
    if not value.isprintable() or (not value.isascii() and max(map(ord, value)) > 0xFFFF):
        value = "".join(c if c.isprintable() and ord(c) <= 0xFFFF else "\ufffd" if ord(c) > 0xFFFF else " "
                        for c in value)
    return value


def check_address(kind: str, value: str, max_chars: int) -> str:
    if not value or len(value) > max_chars:
        raise InvalidArgument(f"{kind} {shown(value)} must be 1..{max_chars} characters, got {len(value)}.")
    if not _ADDRESS.match(value):
        raise InvalidArgument(f"{kind} {shown(value)} must be printable ASCII without spaces.")
    return value


def check_addresses(kind: str, addresses, world_size: int, max_chars: int) -> tuple[str, ...]:
    if len(addresses) not in (0, world_size):
        raise InvalidArgument(
            f"{kind} has {len(addresses)} entries but world_size is {world_size}; send one per rank or none."
        )
    addresses = tuple(addresses)
    for i, a in enumerate(addresses):
        check_address(f"{kind}[{i}]", a, max_chars)
    return addresses


def check_ranks(ranks, world_size: int, max_world_size: int, max_ranks: int) -> tuple[int, ...]:
    """An assignment's ranks: 1..max_ranks distinct ranks of a world of 1..max_world_size.
    The count is checked before the ranks are copied, so a huge list costs nothing."""
    if not 1 <= world_size <= max_world_size:
        raise InvalidArgument(f"assignment world_size must be 1..{max_world_size}, got {world_size}.")
    if not ranks:
        raise InvalidArgument("assignment names no ranks.")
    if len(ranks) > max_ranks:
        raise InvalidArgument(f"assignment names {len(ranks)} ranks; one host runs at most {max_ranks}.")
    ranks = tuple(ranks)
    if len(set(ranks)) != len(ranks):
        raise InvalidArgument(f"assignment ranks {list(ranks)} contain duplicates.")
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise InvalidArgument(f"assignment ranks {bad} are outside 0..{world_size - 1}.")
    return ranks

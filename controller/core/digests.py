"""Replica digests: do the replicas that committed the same step hold the same state? Pure.

A replica's coordinator may send, with a committed step, a digest of its whole training state after
that step (hex, combined over its ranks). Replicas that committed the same step must hold
bitwise-identical state, so their digests must be equal; a difference is divergence (a bug)
or silent data corruption (a host).

`DigestLedger` keeps the digests of the most recent `max_steps` steps (the bound on memory:
digests per step are bounded by the registered replicas, their length by `check_digest`).
A step is *decided* once nobody it waits for is left (every member of the current quorum
has reported that step or a later one) or `wait_s` after its first digest, whichever comes
first, and when it must make room. Deciding a step with two or more digests is
`compare(...)`: the largest group of equal digests is the reference; on a tie, the group that
holds the lowest replica id (the first in ring order), so the job always keeps one reference
state. A digest that arrives after its step was decided is judged against that reference
(`judge_late`): the verdict, once given, stands. Time is an argument; nothing here reads a
clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from controller.core.errors import InvalidArgument

#: A digest shorter than this is too weak to tell states apart.
MIN_DIGEST_CHARS = 8
_HEX = re.compile(r"^[0-9a-f]+$")


def check_digest(digest: str, max_chars: int) -> str:
    """'' (no digest sent) or the digest in lower case; InvalidArgument names a bad one."""
    if not digest:
        return ""
    if not MIN_DIGEST_CHARS <= len(digest) <= max_chars:
        raise InvalidArgument(f"digest {digest[:40]!r}{'…' if len(digest) > 40 else ''} is {len(digest)} "
                              f"characters; it must be {MIN_DIGEST_CHARS}..{max_chars} hex digits.")
    lowered = digest.lower()
    if not _HEX.match(lowered):
        raise InvalidArgument(f"digest {digest[:40]!r} is not hexadecimal (only 0-9 and a-f are allowed).")
    return lowered


def short(digest: str) -> str:
    return digest[:12] + "…" if len(digest) > 12 else digest


@dataclass(frozen=True)
class Verdict:
    """The comparison of one step's digests."""

    step: int
    #: (digest, replicas holding it), the reference group first
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    #: the digest the job keeps
    reference: str
    #: replicas outside the reference group, as judged by this verdict
    diverged: frozenset[str]
    #: no group was larger than every other: the reference was chosen by the lowest replica id
    tie: bool
    reason: str

    @property
    def mismatch(self) -> bool:
        return bool(self.diverged)

    def holders(self) -> str:
        """Every digest with the replicas holding it, for the event."""
        return "; ".join(f"{', '.join(ids)} hold{'s' if len(ids) == 1 else ''} {d}" for d, ids in self.groups)


def _group(reports: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    groups: dict[str, list[str]] = {}
    for rid in sorted(reports):
        groups.setdefault(reports[rid], []).append(rid)
    return {d: tuple(ids) for d, ids in groups.items()}


def _ranked(groups: dict[str, tuple[str, ...]]) -> list[tuple[str, tuple[str, ...]]]:
    """Largest group first; among equals, the one holding the lowest replica id."""
    return sorted(groups.items(), key=lambda g: (-len(g[1]), g[1][0]))


def _ordered(groups: dict[str, tuple[str, ...]], reference: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    rest = _ranked({d: ids for d, ids in groups.items() if d != reference})
    return ((reference, groups.get(reference, ())), *rest)


def compare(step: int, reports: Mapping[str, str]) -> Verdict | None:
    """The verdict on one step's digests (replica id -> digest); None below two reports."""
    if len(reports) < 2:
        return None
    groups = _group(reports)
    ranked = _ranked(groups)
    reference, keep = ranked[0]
    tie = len(ranked) > 1 and len(ranked[1][1]) == len(keep)
    diverged = frozenset(reports) - frozenset(keep)
    if not diverged:
        reason = f"step {step}: all {len(keep)} digests agree ({short(reference)})"
    elif tie:
        reason = (f"step {step}: no majority among {len(reports)} digests; the group holding {keep[0]} (the lowest "
                  f"replica id) is kept as the reference, so {', '.join(sorted(diverged))} re-sync from it")
    else:
        reason = (f"step {step}: {', '.join(sorted(diverged))} differ from the majority "
                  f"({', '.join(keep)}, {len(keep)} of {len(reports)})")
    return Verdict(step, _ordered(groups, reference), reference, diverged, tie, reason)


def judge_late(verdict: Verdict, replica_id: str, digest: str) -> Verdict:
    """A digest for a step already decided: it agrees with the reference or it diverged."""
    groups = {d: tuple(r for r in ids if r != replica_id) for d, ids in verdict.groups}
    groups[digest] = tuple(sorted((*groups.get(digest, ()), replica_id)))
    groups = {d: ids for d, ids in groups.items() if ids}
    diverged = frozenset() if digest == verdict.reference else frozenset({replica_id})
    reason = (f"step {verdict.step}: the late digest of {replica_id} "
              + ("agrees with the reference" if not diverged else
                 f"differs from the reference ({', '.join(groups.get(verdict.reference, ()))}) decided before it"))
    return Verdict(verdict.step, _ordered(groups, verdict.reference), verdict.reference, diverged,
                   verdict.tie, reason)


@dataclass
class _Step:
    first_at: float
    reports: dict[str, str] = field(default_factory=dict)
    decided: bool = False
    verdict: Verdict | None = None


class DigestLedger:
    """The digests of recent steps, and when each step's comparison is due."""

    def __init__(self, max_steps: int, wait_s: float) -> None:
        if max_steps < 1 or not wait_s > 0:
            raise ValueError(f"a digest ledger needs max_steps >= 1 and wait_s > 0, got {max_steps} and {wait_s}.")
        self.max_steps, self.wait_s = max_steps, wait_s
        self._steps: dict[int, _Step] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def record(self, replica_id: str, step: int, digest: str, now: float) -> list[Verdict]:
        """Keep one digest. Returns verdicts given because of it: a late report judged against
        its step's verdict, or the oldest step decided early to make room."""
        entry = self._steps.get(step)
        if entry is None:
            if self._steps and step < min(self._steps) and len(self._steps) >= self.max_steps:
                return []  # older than anything kept: nothing left to compare it with
            entry = self._steps[step] = _Step(first_at=now)
        if entry.decided:
            entry.reports[replica_id] = digest
            if entry.verdict is None:  # decided alone: compare what is there now
                entry.verdict = compare(step, entry.reports)
                return [entry.verdict] if entry.verdict else []
            entry.verdict = judge_late(entry.verdict, replica_id, digest)
            return [entry.verdict]
        entry.reports[replica_id] = digest
        out = []
        while len(self._steps) > self.max_steps:
            oldest = min(self._steps)
            if not self._steps[oldest].decided:  # a decided step's verdict was given once already
                out += self._decide(oldest)
            del self._steps[oldest]
        return out

    def due(self, now: float, waiting_for: Callable[[int], Iterable[str]]) -> list[Verdict]:
        """Decide every undecided step that waits for nobody (`waiting_for(step)`: who may
        still report it) or has waited `wait_s`."""
        out = []
        for step in sorted(self._steps):
            entry = self._steps[step]
            if entry.decided:
                continue
            if now - entry.first_at >= self.wait_s or not set(waiting_for(step)) - set(entry.reports):
                out += self._decide(step)
        return out

    def expected(self, step: int, trusted: Iterable[str]) -> str | None:
        """The digest the job expects at `step`: the decided reference, or else the most
        common digest among `trusted` replicas' reports. None when nobody trusted reported."""
        entry = self._steps.get(step)
        if entry is None:
            return None
        if entry.verdict is not None:
            return entry.verdict.reference
        trusted = set(trusted)
        reports = {r: d for r, d in entry.reports.items() if r in trusted}
        if not reports:
            return None
        return _ranked(_group(reports))[0][0]

    def snapshot(self, max_bytes: int) -> list:
        """What a successor needs to decide the steps kept: per step, its reports, whether it
        was decided and the verdict's groups, reference and tie (its reason was given once);
        the newest steps, as many as fit in `max_bytes` of JSON (counted from above: ids and
        digests are plain ASCII, check_digest and check_id see to it)."""
        out: list = []
        size = 2
        for step in sorted(self._steps, reverse=True):
            e = self._steps[step]
            v = e.verdict
            size += 80 + sum(len(r) + len(d) + 12 for r, d in e.reports.items()) * (1 if v is None else 2)
            if size > max_bytes:
                break
            out.append([step, dict(e.reports), e.decided, None if v is None else
                        [[[d, list(ids)] for d, ids in v.groups], v.reference, v.tie]])
        return out[::-1]

    def restore(self, snapshot: list | None, now: float) -> None:
        """Load `snapshot()`'s output; a pending step waits `wait_s` anew from `now` (the old
        leader's clock is not this one's)."""
        self._steps = {}
        for step, reports, decided, verdict in (snapshot or [])[-self.max_steps:]:
            entry = self._steps[step] = _Step(first_at=now, reports=dict(reports), decided=decided)
            if verdict is not None:
                groups, reference, tie = verdict
                entry.verdict = Verdict(step, tuple((d, tuple(ids)) for d, ids in groups), reference, frozenset(),
                                        tie, "")

    def _decide(self, step: int) -> list[Verdict]:
        entry = self._steps[step]
        entry.decided = True
        entry.verdict = compare(step, entry.reports)
        return [entry.verdict] if entry.verdict else []

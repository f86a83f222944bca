"""Findings (what the analyzers concluded, with evidence) and the bounded log that keeps them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class FindingKind(str, enum.Enum):
    HANG = "hang"
    STRAGGLER = "straggler"
    SDC = "sdc"


class ActionKind(str, enum.Enum):
    #: cordon the host and swap its work onto a spare
    EVICT = "evict"
    #: dry-run: the eviction that would have been made
    DRY_RUN = "dry_run"
    #: a limit holds it for now (hourly budget, min_replicas, no spare); decided again later
    HOLD = "hold"
    #: reported only (low confidence, not enough evidence yet, nothing to act on)
    REPORT = "report"


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    #: what it is about, so the same problem is reported once (e.g. the blocking collective)
    key: str
    at: float
    #: candidate hosts, the most likely first
    hosts: tuple[str, ...]
    #: how sure the analyzer is that hosts[0] is the culprit (0..1)
    confidence: float
    summary: str
    evidence: tuple[str, ...] = ()
    #: suspect ranks ("replica/rank"), the most likely first
    ranks: tuple[str, ...] = ()
    #: straggler: windows flagged; sdc: the first host's incidents in the SDC window
    count: int = 1
    #: whether the first host's own telemetry shows the problem (a hang: its rank joined the
    #: stuck collective, or it reported itself idle that long); when not, the hosts whose
    #: telemetry it rests on (`witnesses`) must be more than one other (policy.decide)
    own_evidence: bool = True
    witnesses: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    action: ActionKind
    host_id: str
    reason: str


@dataclass(frozen=True)
class Entry:
    id: int
    finding: Finding
    decision: Decision
    decided_at: float


class FindingLog:
    """The recent findings with their decisions (newest last, at most `keep`), and counters."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.entries: list[Entry] = []
        self.next_id = 1
        self.findings_by_kind: dict[str, int] = {k.value: 0 for k in FindingKind}
        self.actions_by_kind: dict[str, int] = {k.value: 0 for k in ActionKind}

    def add(self, finding: Finding, decision: Decision, now: float) -> Entry:
        entry = Entry(self.next_id, finding, decision, now)
        self.next_id += 1
        self.entries.append(entry)
        self.findings_by_kind[finding.kind.value] += 1
        self.actions_by_kind[decision.action.value] += 1
        del self.entries[: max(len(self.entries) - self.keep, 0)]
        return entry

    def redecide(self, entry_id: int, decision: Decision, now: float, finding: Finding | None = None) -> Entry | None:
        """A finding decided again (held, or with more evidence: `finding` replaces the entry's);
        counted only when its action changes. None when the entry left the log."""
        for i, e in enumerate(self.entries):
            if e.id == entry_id:
                if e.decision.action != decision.action:
                    self.actions_by_kind[decision.action.value] += 1
                self.entries[i] = replace(e, finding=finding or e.finding, decision=decision, decided_at=now)
                return self.entries[i]
        return None

    def page(self, limit: int, before_id: int | None = None, kind: str | None = None) -> list[Entry]:
        """Newest first: at most `limit` entries with id below `before_id`, of `kind` if given."""
        out = []
        for e in reversed(self.entries):
            if (before_id is None or e.id < before_id) and (kind is None or e.finding.kind.value == kind):
                out.append(e)
                if len(out) >= limit:
                    break
        return out

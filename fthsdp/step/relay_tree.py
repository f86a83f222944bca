"""The relay tree of a replica's coordinator: who forwards to whom, and what goes up. Pure.

A replica of N ranks is cut into groups of `fanout` consecutive ranks (about sqrt(N) each).
Group 0 -- rank 0's own group -- talks to the coordinator directly; every other group has a
relay, its first rank, whose process accepts the group's connections (its own rank's too)
and keeps one connection up to the coordinator. So the coordinator writes a plan or a
decision about 2*sqrt(N) times, not N times, and reads about as many votes:

    coordinator (rank 0) ── ranks 1..f-1 of group 0
         │
         ├── relay f    ── ranks f..2f-1
         ├── relay 2f   ── ranks 2f..3f-1
         └── ...

On the way up a relay sends one message for its group where its ranks would send one each:

- `BeginGather`: once every rank of the group began a step, which step (one message when
  they agree, one per step when they do not: the coordinator names the disagreement);
- `VoteGather`: the first "no" at once, with its rank and reason (the attempt is lost
  anyway); otherwise one "all yes" with the summed loss and tokens once every rank voted. A
  relay that died (its connection to the coordinator broke) takes its whole group with it --
  those ranks vote "no" by absence, as a dead rank does without relays;
- `DigestGather`: the group's state digests in rank order, once all arrived.

One silent rank must not silence its group: each gather's `flush()` (the relay calls it
FLUSH_FRACTION of gather_timeout_s after the gather's first message, well before the
coordinator's own timeout) sends up what the members that did answer said, and from then on
each late member's message goes up on its own. So the coordinator's timeout names only the
rank that stayed silent.

Nothing here touches a socket, a clock or a frame format: inputs in, what to send out.
How a hello is authenticated is not the tree's business either: a relay forwards what its
authenticated upstream connection sends, and what its authenticated ranks send.

Where it is used: a relay rank hosts fthsdp/step/relay.py (the I/O, with the gathers
below), the coordination takes a group's messages in fthsdp/step/relay_links.py, the
frames are fthsdp/step/relay_messages.py's, and RuntimeSettings.relay_fanout picks the
fanout (0: DIRECT_UP_TO_RANKS, then about sqrt(N)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Below this many ranks a tree only adds a hop: every rank talks to the coordinator.
DIRECT_UP_TO_RANKS = 64
#: A relay sends up what its answering members said this far into gather_timeout_s.
FLUSH_FRACTION = 0.5


@dataclass(frozen=True)
class RelayTree:
    world_size: int
    #: ranks per group (the last group may be smaller)
    fanout: int

    @classmethod
    def for_world(cls, world_size: int, fanout: int = 0) -> "RelayTree":
        """The layout for `world_size` ranks: `fanout` ranks per group, or about sqrt(world)
        when 0 (and one group -- no relays -- up to DIRECT_UP_TO_RANKS ranks)."""
        if world_size < 1:
            raise ValueError(f"a relay tree needs at least 1 rank, got world_size={world_size}.")
        if fanout < 0:
            raise ValueError(f"fanout must be 0 (about sqrt(world_size)) or positive, got {fanout}.")
        if fanout == 0:
            fanout = world_size if world_size <= DIRECT_UP_TO_RANKS else math.isqrt(world_size - 1) + 1
        return cls(world_size, min(fanout, world_size))

    @property
    def groups(self) -> int:
        return -(-self.world_size // self.fanout)

    @property
    def relays(self) -> tuple[int, ...]:
        """The relay ranks (every group's first rank but group 0's)."""
        return tuple(range(self.fanout, self.world_size, self.fanout))

    def group_of(self, rank: int) -> int:
        self._check(rank)
        return rank // self.fanout

    def members(self, group: int) -> range:
        """The ranks of `group`, its relay (the first) included."""
        if not 0 <= group < self.groups:
            raise ValueError(f"group {group} is not one of 0..{self.groups - 1}.")
        return range(group * self.fanout, min((group + 1) * self.fanout, self.world_size))

    def upstream(self, rank: int) -> int | None:
        """The relay rank `rank` connects to, or None: it talks to the coordinator itself."""
        group = self.group_of(rank)
        return None if group == 0 else group * self.fanout

    def coordinator_links(self) -> int:
        """How many connections the coordinator serves: group 0's ranks and one per relay."""
        return len(self.members(0)) + len(self.relays)

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not one of 0..{self.world_size - 1}.")


# ---------------------------------------------------------------- what goes up


@dataclass(frozen=True)
class GroupBegin:
    """Ranks `ranks` of one group began `step`."""
    step: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class GroupVote:
    """One group's vote on `attempt`: every rank yes (ok, with sums), or the first no."""
    attempt: int
    ok: bool
    ranks: tuple[int, ...]
    reason: str = ""
    loss_sum: float = 0.0
    tokens: int = 0


@dataclass(frozen=True)
class GroupDigests:
    attempt: int
    step: int
    #: (rank, sha256) in rank order
    digests: tuple[tuple[int, bytes], ...]


class GatherError(ValueError):
    """A message from a rank outside the group: a bug upstream (nothing is changed)."""


class _Gather:
    ranks: range

    def _check(self, rank: int) -> None:
        if rank not in self.ranks:
            raise GatherError(f"rank {rank} is not in this group ({self.ranks.start}..{self.ranks.stop - 1}).")


@dataclass
class BeginGather(_Gather):
    """Begins of one round: one message up once every rank of the group began."""

    ranks: range
    steps: dict[int, int] = field(default_factory=dict)
    #: members left out of the last flush: each one's begin goes up on its own when it comes
    late: set[int] = field(default_factory=set)

    def begin(self, rank: int, step: int) -> list[GroupBegin]:
        self._check(rank)
        if rank in self.late:
            self.late.discard(rank)
            return [GroupBegin(step, (rank,))]
        if self.steps.get(rank) == step:
            return []  # said again: nothing new
        self.steps[rank] = step
        if len(self.steps) < len(self.ranks):
            return []
        by_step: dict[int, list[int]] = {}
        for r in self.ranks:
            by_step.setdefault(self.steps[r], []).append(r)
        self.steps = {}
        return [GroupBegin(s, tuple(rs)) for s, rs in sorted(by_step.items())]

    def flush(self) -> list[GroupBegin]:
        """The begins so far, of the members that began (the others' go up when they come)."""
        if not self.steps:
            return []
        by_step: dict[int, list[int]] = {}
        for r in sorted(self.steps):
            by_step.setdefault(self.steps[r], []).append(r)
        self.late = set(self.ranks) - set(self.steps)
        self.steps = {}
        return [GroupBegin(s, tuple(rs)) for s, rs in sorted(by_step.items())]


@dataclass
class VoteGather(_Gather):
    """Votes of one attempt: the first no goes up at once, else one yes once all voted."""

    ranks: range
    attempt: int
    yes: set[int] = field(default_factory=set)
    loss_sum: float = 0.0
    tokens: int = 0
    sent: bool = False
    #: flushed: the yes votes so far went up; each later one goes up on its own
    flushed: bool = False

    def vote(self, rank: int, attempt: int, ok: bool, reason: str = "", loss: float = 0.0,
             tokens: int = 0) -> list[GroupVote]:
        self._check(rank)
        if attempt != self.attempt or self.sent or rank in self.yes:
            return []  # another attempt's, after this group's vote went up, or said again
        if not ok:
            self.sent = True
            return [GroupVote(attempt, False, (rank,), f"rank {rank} voted no: {reason or 'no reason given'}")]
        if self.flushed:
            self.yes.add(rank)
            self.sent = len(self.yes) == len(self.ranks)
            return [GroupVote(attempt, True, (rank,), "", loss, tokens)]
        self.yes.add(rank)
        self.loss_sum += loss
        self.tokens += tokens
        if len(self.yes) < len(self.ranks):
            return []
        self.sent = True
        return [GroupVote(attempt, True, tuple(self.ranks), "", self.loss_sum, self.tokens)]

    def left(self, rank: int, reason: str) -> list[GroupVote]:
        """A rank of the group is gone (its connection broke): the group votes no for it."""
        self._check(rank)
        if self.sent:
            return []
        self.sent = True
        return [GroupVote(self.attempt, False, (rank,), f"rank {rank} left the replica: {reason}")]

    def missing(self) -> tuple[int, ...]:
        return tuple(r for r in self.ranks if r not in self.yes)

    def flush(self) -> list[GroupVote]:
        """The yes votes so far, of the members that voted (the others' go up when they come)."""
        if self.sent or self.flushed:
            return []
        self.flushed = True
        if not self.yes:
            return []
        return [GroupVote(self.attempt, True, tuple(sorted(self.yes)), "", self.loss_sum, self.tokens)]


@dataclass
class DigestGather(_Gather):
    """Digests of one committed step: one message up with all of the group's."""

    ranks: range
    attempt: int
    step: int
    got: dict[int, bytes] = field(default_factory=dict)
    flushed: bool = False

    def digest(self, rank: int, attempt: int, step: int, sha256: bytes) -> list[GroupDigests]:
        self._check(rank)
        if (attempt, step) != (self.attempt, self.step) or rank in self.got:
            return []
        self.got[rank] = sha256
        if self.flushed:
            return [GroupDigests(attempt, step, ((rank, sha256),))]
        if len(self.got) < len(self.ranks):
            return []
        return [GroupDigests(attempt, step, tuple((r, self.got[r]) for r in self.ranks))]

    def flush(self) -> list[GroupDigests]:
        """The digests so far, of the members that sent theirs (the others' go up when they come)."""
        if self.flushed or len(self.got) == len(self.ranks):
            return []
        self.flushed = True
        if not self.got:
            return []
        return [GroupDigests(self.attempt, self.step, tuple((r, self.got[r]) for r in sorted(self.got)))]

"""The coordination's side of relays: a group's message taken for all of its ranks. Pure.

Mixed into `Coordination` (fthsdp/step/coordination.py), whose state it shares: a relay's
connection is bound to one group of the relay tree (fthsdp/step/relay_tree.py) by its
relay_hello; each rank behind it is bound to that connection by its relayed hello. Then

- a group begin, vote or digests counts as every named rank's own begin, vote or digest
  (the same rules: late, duplicated or other attempts' messages are ignored; the first no
  decides RETRY with the reason the relay gave);
- a relayed close counts as the rank's close, a rank_left as its connection breaking;
- a frame for one rank behind a relay goes in a to_ranks on the relay's connection, and a
  frame for all of a group's ranks goes once, bare;
- the relay's connection breaking takes every rank of its group with it: the attempt in
  flight is retried (the reason names the group's ranks) and the replica fails, as when a
  rank's own connection breaks. A relay that hangs leaves its ranks silent: the vote
  timeout decides RETRY and names them.

A relay's message naming a rank outside its group is a bug of the relay: it is refused (the
relay's connection is closed) and changes nothing. Ranks of the group that are not (or no
longer) bound to the relay are left out of a message; they are late.
"""

from __future__ import annotations

from fthsdp.step.coordination_types import Effect, FromRank, ProtocolError, Refuse, SendTo, Stage
from fthsdp.step.messages import clip
from fthsdp.step.relay_messages import to_ranks
from protos import replica_pb2 as rpb


class RelayLinks:
    # ------------------------------------------------------------ sending to ranks

    def _send(self, rank: int, frame: rpb.CoordinatorFrame) -> Effect:
        """`frame` for one rank: on its own connection, or addressed on its relay's."""
        conn = self.conn_of[rank]
        return SendTo(conn, to_ranks([(rank, frame)]) if conn in self.link_group else frame)

    def _each(self, frames) -> tuple:
        """(rank, frame) pairs as (connection, frame) pairs: one to_ranks per relay."""
        direct, relayed = [], {}
        for rank, frame in frames:
            conn = self.conn_of[rank]
            if conn in self.link_group:
                relayed.setdefault(conn, []).append((rank, frame))
            else:
                direct.append((conn, frame))
        return tuple(direct) + tuple((conn, to_ranks(items)) for conn, items in relayed.items())

    def _send_ranks(self, conn: int, ranks: list[int], frame: rpb.CoordinatorFrame) -> Effect:
        """One frame for `ranks`, all behind relay connection `conn`: bare when they are its whole group."""
        group = self.tree.members(self.link_group[conn])
        if len(ranks) == len(group):
            return SendTo(conn, frame)
        return SendTo(conn, to_ranks([(r, frame) for r in ranks]))

    def relay_address(self, rank: int) -> str | None:
        """Where rank `rank`'s relay listens; None while it is not connected ("" when the rank has none)."""
        group = self.tree.upstream(rank)
        if group is None:
            return ""
        link = self.relay_links.get(self.tree.group_of(rank))
        return None if link is None else link[1]

    # ------------------------------------------------------------ a relay's messages

    def _relay_hello(self, conn: int, h: rpb.RelayHello) -> list[Effect]:
        s, tree = self.settings, self.tree
        if conn in self.rank_of:
            return [Refuse(conn, f"rank {self.rank_of[conn]} sent a relay hello after its own")]
        if (h.world_size, h.fanout) != (self.world, tree.fanout):
            return [Refuse(conn, f"relay hello for {h.world_size} ranks in groups of {h.fanout}; this replica has "
                                 f"{self.world} ranks in groups of {tree.fanout} (check relay_fanout)")]
        if not 1 <= h.group < tree.groups:
            return [Refuse(conn, f"relay hello for group {h.group}; this replica's relays serve groups "
                                 f"1..{tree.groups - 1}")]
        if (h.job_id, h.replica_id) != (s.job_id, s.replica_id):
            return [Refuse(conn, f"relay hello for job {h.job_id!r} replica {h.replica_id!r}; this coordinator "
                                 f"serves job {s.job_id!r} replica {s.replica_id!r}")]
        if h.group in self.relay_links:
            return [Refuse(conn, f"the relay of group {h.group} is already connected (a second process claims it)")]
        if self.stage is not Stage.CONNECTING:
            return [Refuse(conn, f"relay hello for group {h.group} after the replica started; restart the replica")]
        self.link_group[conn] = h.group
        self.relay_links[h.group] = (conn, h.address)
        self.link_ranks[conn] = set()
        return []

    def _from_relay(self, ev: FromRank, now: float) -> list[Effect]:
        conn, kind, m = ev.conn, ev.kind, ev.message
        group = self.link_group[conn]
        members = self.tree.members(group)
        named = [m.rank] if kind in ("relayed", "rank_left") else list(m.ranks)
        if min(named) < members.start or max(named) >= members.stop:  # the decoder let no empty list through
            outside = [r for r in named if r not in members]
            return [Refuse(conn, f"the relay of group {group} (ranks {members.start}..{members.stop - 1}) sent a "
                                 f"{kind} naming rank(s) {outside[:8]} outside its group")]
        if kind == "relayed":
            inner_kind = m.frame.WhichOneof("body")
            if inner_kind == "hello":
                return self._hello(conn, m.frame.hello, now, relayed=True)
            if m.rank not in self.link_ranks[conn]:
                return []
            return self._close(m.rank, m.frame.close, now)
        bound = self.link_ranks[conn]
        ranks = named if bound.issuperset(named) else [r for r in named if r in bound]
        if not ranks:
            return []  # late: they left
        if kind == "rank_left":
            self.conn_of.pop(m.rank)
            bound.discard(m.rank)
            return self._departed(ranks, f"rank {m.rank} left the replica: {m.reason}", now)
        if kind == "group_begin":
            return self._group_begin(conn, ranks, m.step, now)
        if kind == "group_vote":
            return self._group_vote(ranks, m, now)
        if kind == "group_digests":
            return self._group_digests(ranks, m, now)
        raise ProtocolError(f"the coordinator cannot take a {kind!r} frame from a relay")

    def _link_lost(self, conn: int, reason: str, now: float) -> list[Effect]:
        group = self.link_group.pop(conn)
        self.relay_links.pop(group, None)
        members = self.tree.members(group)
        ranks = sorted(self.link_ranks.pop(conn))
        for r in ranks:
            del self.conn_of[r]
        return self._departed(ranks, f"ranks {members.start}..{members.stop - 1} left the replica: their relay "
                                     f"(rank {members.start}) is gone: {reason}", now)

    def _group_begin(self, conn: int, ranks: list[int], step: int, now: float) -> list[Effect]:
        return self._begin_ranks(ranks, step, lambda frame: self._send_ranks(conn, ranks, frame), now)

    def _group_vote(self, ranks: list[int], m: rpb.GroupVote, now: float) -> list[Effect]:
        return self._count_votes(ranks, m.attempt, m.ok, clip(m.reason or f"rank {ranks[0]} voted no: no reason given"),
                                 m.loss_sum, m.tokens, now)

    def _group_digests(self, ranks: list[int], m: rpb.GroupDigests, now: float) -> list[Effect]:
        r = self.round
        if self.stage is not Stage.DIGESTS or m.attempt != self.attempt or m.step != r.trained:
            return []
        bound = set(ranks)
        for k, sha in zip(m.ranks, m.sha256):
            if k in bound:
                r.digests.setdefault(k, sha)
        return self._maybe_digests_done(now)

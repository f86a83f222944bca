"""Synthetic telemetry for the analyzer tests: a job of replicas x ranks on hosts, every rank in
its replica's group ("replica", intra) and its rank position's ring ("ftar.q1", cross), plus
helpers that make one rank hang (never join / no progress) the way a real job would look."""

from __future__ import annotations


from controller.core.diagnosis.telemetry import GroupReport, RankReport, RankView, Window
from protos.telemetry_ring import Kind

INTRA, CROSS = "replica", "ftar.q1"


def host_of(rid: str, rank: int, per_host: int) -> str:
    return f"h-{rid}-{rank // per_host}"


def group(name, kind, size, joined, done, pending=None, windows=()):
    """pending: (seq, pending_s, sent_bytes, idle_s) of the oldest collective not done."""
    g = GroupReport(name, int(kind), size, joined, done, windows=tuple(windows))
    if pending is not None:
        seq, age, sent, idle = pending
        g = g._replace(pending_seq=seq, pending_s=age, pending_nbytes=1 << 20, pending_sent_bytes=sent,
                    pending_idle_s=idle)
    return g


class Job:
    def __init__(self, replicas: int = 3, ranks: int = 4, per_host: int = 2, received_at: float = 1000.0):
        self.replicas = [f"r{i}" for i in range(replicas)]
        self.ranks, self.per_host, self.received_at = ranks, per_host, received_at
        self.views: dict[tuple[str, int], RankView] = {}
        self.steady(10, 20)

    def keys(self):
        return [(rid, k) for rid in self.replicas for k in range(self.ranks)]

    def host(self, rk) -> str:
        return host_of(rk[0], rk[1], self.per_host)

    def set(self, rk, *groups, idle_s: float = 0.05, received_at: float | None = None) -> None:
        self.views[rk] = RankView(self.host(rk), self.received_at if received_at is None else received_at,
                                  RankReport(rk[0], rk[1], idle_s, 600.0, tuple(groups)))

    def steady(self, intra_seq: int, cross_seq: int) -> None:
        """Everyone between collectives: last joined = last done."""
        for rk in self.keys():
            self.set(rk, group(INTRA, Kind.REDUCE_SCATTER, self.ranks, intra_seq, intra_seq),
                     group(CROSS, Kind.FTAR_ALL_REDUCE, len(self.replicas), cross_seq, cross_seq))

    def never_joins(self, culprit, waited_s: float = 40.0) -> None:
        """`culprit` hangs outside collectives: its replica waits in the next intra collective,
        the other replicas wait in the next FTAR op for its replica's ranks."""
        rid, _ = culprit
        for rk in self.keys():
            if rk == culprit:
                self.set(rk, group(INTRA, Kind.REDUCE_SCATTER, self.ranks, 10, 10),
                         group(CROSS, Kind.FTAR_ALL_REDUCE, len(self.replicas), 20, 20), idle_s=waited_s + 5)
            elif rk[0] == rid:
                self.set(rk, group(INTRA, Kind.REDUCE_SCATTER, self.ranks, 11, 10, (11, waited_s, 4096, waited_s - 1)),
                         group(CROSS, Kind.FTAR_ALL_REDUCE, len(self.replicas), 20, 20), idle_s=waited_s - 1)
            else:
                self.set(rk, group(INTRA, Kind.REDUCE_SCATTER, self.ranks, 11, 11),
                         group(CROSS, Kind.FTAR_ALL_REDUCE, len(self.replicas), 21, 20, (21, waited_s - 2, 8192, waited_s - 3)),
                         idle_s=waited_s - 3)

    def no_progress(self, culprit, waited_s: float = 40.0, cross: bool = True) -> None:
        """`culprit` joined the next collective and never sent a byte; everybody else in that
        collective sent at least a chunk before starving. In the cross case its replica's
        other ranks wait in the following intra collective for it; other replicas' ranks too."""
        rid, k = culprit
        n = len(self.replicas) if cross else self.ranks
        for rk in self.keys():
            in_it = (rk[1] == k) if cross else (rk[0] == rid)
            sent = 0 if rk == culprit else 4096 * (1 + rk[1] % 3)
            stuck = (21 if cross else 11, waited_s, sent, waited_s if rk == culprit else waited_s - 1)
            if cross:
                intra = group(INTRA, Kind.REDUCE_SCATTER, self.ranks, 12, 11, (12, waited_s - 2, 4096, waited_s - 3)) \
                    if not in_it else group(INTRA, Kind.REDUCE_SCATTER, self.ranks, 11, 11)
                ftar = group(CROSS, Kind.FTAR_ALL_REDUCE, n, 21, 20, stuck) if in_it else \
                    group(CROSS, Kind.FTAR_ALL_REDUCE, n, 21, 21)
            else:
                intra = group(INTRA, Kind.REDUCE_SCATTER, n, 11, 10, stuck) if in_it else \
                    group(INTRA, Kind.REDUCE_SCATTER, n, 11, 11)
                ftar = group(CROSS, Kind.FTAR_ALL_REDUCE, len(self.replicas), 20, 20) if in_it else \
                    group(CROSS, Kind.FTAR_ALL_REDUCE, len(self.replicas), 21, 20, (21, waited_s - 2, 8192, waited_s - 3))
            self.set(rk, intra, ftar)


def windows(*own_s: float, start: int = 0):
    return tuple(Window(start + i, v, 1.0) for i, v in enumerate(own_s))

"""Telemetry reports and findings between their wire (proto, JSON) and core forms.

Lists are counted before anything is copied: an oversized report is refused having cost
no more than its decoding.
"""

from __future__ import annotations

from controller.core.diagnosis.findings import Entry
from controller.core.diagnosis.telemetry import GroupReport, HostReport, RankReport, Window
from controller.core.errors import InvalidArgument
from protos import controller_pb2 as pb
from protos.telemetry_ring import MAX_GROUPS_PER_RANK, MAX_RANKS_PER_REPORT, MAX_WINDOWS_PER_GROUP


def from_proto_report(m: pb.TelemetryReport) -> HostReport:
    if len(m.ranks) > MAX_RANKS_PER_REPORT:
        raise InvalidArgument(f"a telemetry report carries at most {MAX_RANKS_PER_REPORT} ranks, got {len(m.ranks)}.")
    ranks = []
    for r in m.ranks:
        if len(r.groups) > MAX_GROUPS_PER_RANK:
            raise InvalidArgument(f"rank {r.replica_id[:40]}/{r.rank} reports {len(r.groups)} groups; the limit is "
                                  f"{MAX_GROUPS_PER_RANK}.")
        groups = []
        for g in r.groups:
            if len(g.windows) > MAX_WINDOWS_PER_GROUP:
                raise InvalidArgument(f"rank {r.replica_id[:40]}/{r.rank} group {g.group[:40]!r} carries "
                                      f"{len(g.windows)} windows; the limit is {MAX_WINDOWS_PER_GROUP}.")
            groups.append(GroupReport(
                g.group, g.kind, g.size, g.last_joined_seq, g.last_done_seq, g.pending_seq, g.pending_s,
                g.pending_nbytes, g.pending_sent_bytes, g.pending_idle_s,
                tuple(Window(w.index, w.own_s, w.wait_s, w.disturbed) for w in g.windows)))
        ranks.append(RankReport(r.replica_id, r.rank, r.idle_s, r.recording_s, tuple(groups)))
    return HostReport(m.host_id, m.window_collectives, tuple(ranks))


def entry_view(e: Entry) -> dict:
    f, d = e.finding, e.decision
    return {
        "id": e.id, "kind": f.kind.value, "at": f.at, "key": f.key, "hosts": list(f.hosts),
        "confidence": f.confidence, "summary": f.summary, "evidence": list(f.evidence), "ranks": list(f.ranks),
        "count": f.count, "action": d.action.value, "action_host": d.host_id, "action_reason": d.reason,
        "decided_at": e.decided_at,
    }

"""Ages a report may claim: no more than the time since its host's previous report allows. Pure.

A rank's report says how long it has been in its oldest pending collective (`pending_s`,
`pending_idle_s`) and idle (`idle_s`), measured on its host. Between two reports of the same
rank from the same host, an age can grow by at most the time between them (plus
`AGE_SLACK_S` for the two hosts' scheduling): a collective not pending at the previous report
began after it, a pending one is older by at most the time since. An age beyond that is cut to
it, and the report says so; so one report cannot claim a 30 s hang its previous reports did not
show. A rank's first report (and the first from a new host) is taken as it is.
"""

from __future__ import annotations

from controller.core.diagnosis.telemetry import RankReport, RankView, rank_name

#: What the reporting host's and the controller's scheduling may add between two reports.
AGE_SLACK_S = 2.0


def plausible(report: RankReport, previous: RankView | None, host_id: str, now: float) -> tuple[RankReport, list[str]]:
    """`report` with its ages cut to what `previous` (the same rank's last view) allows."""
    if previous is None or previous.host_id != host_id:
        return report, []
    since = max(now - previous.received_at, 0.0) + AGE_SLACK_S
    before = {g.group: g for g in previous.report.groups}
    notes, groups = [], []
    for g in report.groups:
        if g.pending_seq >= 0:
            old = before.get(g.group)
            limit = since + (old.pending_s if old is not None and old.pending_seq == g.pending_seq else 0.0)
            if g.pending_s > limit or g.pending_idle_s > limit:
                notes.append(f"rank {rank_name((report.replica_id, report.rank))}: {g.group} #{g.pending_seq} pending "
                             f"{g.pending_s:.1f} s is more than the {limit:.1f} s its previous report allows; cut")
                g = g._replace(pending_s=min(g.pending_s, limit), pending_idle_s=min(g.pending_idle_s, limit))
        groups.append(g)
    idle_limit = previous.report.idle_s + since
    idle = report.idle_s
    if idle > idle_limit:
        notes.append(f"rank {rank_name((report.replica_id, report.rank))}: idle {idle:.1f} s is more than the "
                     f"{idle_limit:.1f} s its previous report allows; cut")
        idle = idle_limit
    if not notes:
        return report, []
    return report._replace(idle_s=idle, groups=tuple(groups)), notes


__all__ = ["AGE_SLACK_S", "plausible"]

"""The eviction policy, rule by rule, with its limits on a fake clock (time is an argument)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.core.diagnosis.findings import ActionKind, Finding, FindingKind
from controller.core.diagnosis.policy import HOUR_S, HostFacts, PolicyView, decide
from controller.core.diagnosis.settings import DiagnosisSettings

S = DiagnosisSettings(max_evictions_per_hour=2, min_confidence=0.5, sdc_evict_after=2)
HANG = Finding(FindingKind.HANG, "hang:x", 100.0, ("h1", "h2"), 0.95, "rank r1/2 never joined")
HOST = HostFacts(known=True, active=True, cordoned=False, replica_live=True)
VIEW = PolicyView(now=1000.0, live_replicas=3, min_replicas=2, free_spares=1, evictions_at=())


@pytest.mark.parametrize("finding, host, view, settings, action, text", [
    (HANG, HOST, VIEW, S, ActionKind.EVICT, "evict host h1 (hang, confidence 0.95, 1 free spare(s), 0 eviction"),
    (replace(HANG, hosts=()), HOST, VIEW, S, ActionKind.REPORT, "no host is named"),
    (replace(HANG, confidence=0.3), HOST, VIEW, S, ActionKind.REPORT, "confidence 0.30 is below 0.50: 2 candidate"),
    (replace(HANG, kind=FindingKind.SDC, count=1), HOST, VIEW, S, ActionKind.REPORT,
     "in the digest minority 1 time(s); it is evicted after 2"),
    (replace(HANG, kind=FindingKind.SDC, count=2), HOST, VIEW, S, ActionKind.EVICT, "evict host h1 (sdc"),
    (HANG, replace(HOST, active=False), VIEW, S, ActionKind.REPORT, "host h1 runs nothing now"),
    (HANG, replace(HOST, known=False), VIEW, S, ActionKind.REPORT, "host h1 runs nothing now"),
    (HANG, replace(HOST, cordoned=True), VIEW, S, ActionKind.REPORT, "already cordoned"),
    (HANG, HOST, replace(VIEW, live_replicas=2), S, ActionKind.HOLD,
     "would leave 1 live replica(s), below min_replicas 2"),
    (HANG, replace(HOST, replica_live=False), replace(VIEW, live_replicas=2), S, ActionKind.EVICT, "evict"),
    (HANG, HOST, replace(VIEW, free_spares=0), S, ActionKind.HOLD, "no free spare"),
    (HANG, HOST, VIEW, replace(S, dry_run=True), ActionKind.DRY_RUN, "dry-run: would evict host h1 (hang"),
    (HANG, HOST, replace(VIEW, free_spares=0), replace(S, dry_run=True), ActionKind.HOLD, "no free spare"),
])
def test_rules_in_order(finding, host, view, settings, action, text):
    d = decide(finding, host, view, settings)
    assert d.action == action and text in d.reason
    assert d.host_id == (finding.hosts[0] if finding.hosts else "")


def test_the_hourly_budget_slides_on_the_clock():
    evictions = (1000.0, 2000.0)
    view = replace(VIEW, evictions_at=evictions)
    held = decide(HANG, HOST, replace(view, now=2500.0), S)
    assert held.action == ActionKind.HOLD and "2 eviction(s) in the last hour reach the limit of 2" in held.reason
    # one hour after the first eviction, one slot is free again
    assert decide(HANG, HOST, replace(view, now=1000.0 + HOUR_S - 0.001), S).action == ActionKind.HOLD
    assert decide(HANG, HOST, replace(view, now=1000.0 + HOUR_S), S).action == ActionKind.EVICT
    assert decide(HANG, HOST, view, replace(S, max_evictions_per_hour=0)).action == ActionKind.HOLD

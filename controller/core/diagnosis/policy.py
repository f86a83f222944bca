"""From a finding to an action: a pure decision with its reason.

Rules, in order (the first that applies decides):
  1. nothing to act on: no host named, or not enough evidence yet (an SDC host below
     `sdc_evict_after` incidents), or confidence below `min_confidence` → REPORT;
  2. the host runs nothing, is gone or is already cordoned → REPORT;
  3. evicting it would leave fewer live replicas than min_replicas → HOLD;
  4. `max_evictions_per_hour` evictions in the last hour → HOLD;
  5. no free spare to take its work → HOLD;
  6. dry-run → DRY_RUN (what would have been done, and why);
  7. otherwise → EVICT: cordon the host and swap its replica's work onto a spare.
A held finding is decided again later (a spare frees, the hour passes) until it is `hold_s` old.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.diagnosis.findings import ActionKind, Decision, Finding, FindingKind
from controller.core.diagnosis.settings import DiagnosisSettings

HOUR_S = 3600.0


@dataclass(frozen=True)
class HostFacts:
    """What the policy needs to know of the suspect host."""

    known: bool
    #: it runs an assignment (and its agent is alive)
    active: bool
    cordoned: bool
    #: its replica is live (joining, healthy, behind or diverged): evicting takes it out for a while
    replica_live: bool


@dataclass(frozen=True)
class PolicyView:
    now: float
    live_replicas: int
    min_replicas: int
    free_spares: int
    #: when the diagnosis evicted hosts (the hourly budget)
    evictions_at: tuple[float, ...]


def decide(finding: Finding, host: HostFacts, view: PolicyView, settings: DiagnosisSettings) -> Decision:
    """What to do about `finding` (its first host), and why."""
    if not finding.hosts:
        return Decision(ActionKind.REPORT, "", "no host is named")
    h = finding.hosts[0]
    # 1. Not enough to act on.
    if finding.kind == FindingKind.SDC and finding.count < settings.sdc_evict_after:
        return Decision(ActionKind.REPORT, h, f"host {h} was in the digest minority {finding.count} time(s); "
                                              f"it is evicted after {settings.sdc_evict_after}")
    if finding.confidence < settings.min_confidence:
        return Decision(ActionKind.REPORT, h, f"confidence {finding.confidence:.2f} is below "
                                              f"{settings.min_confidence:.2f}: {len(finding.hosts)} candidate "
                                              f"host(s) {', '.join(finding.hosts[:5])}")
    # 1b. One host's word about another is not enough: the suspect's own telemetry, or more
    # than one other host's.
    others = sorted(set(finding.witnesses) - {h})
    if not finding.own_evidence and len(others) < 2:
        return Decision(ActionKind.REPORT, h, f"host {h}'s own telemetry does not show it, and only "
                                              f"{len(others)} other host(s) ({', '.join(others[:3]) or 'none'}) "
                                              f"say so: a host is evicted on its own evidence or on that of more "
                                              f"than one other host")
    # 2. Nothing left to evict.
    if not host.known or not host.active:
        return Decision(ActionKind.REPORT, h, f"host {h} runs nothing now")
    if host.cordoned:
        return Decision(ActionKind.REPORT, h, f"host {h} is already cordoned")
    # 3. Never below min_replicas.
    after = view.live_replicas - (1 if host.replica_live else 0)
    if after < view.min_replicas:
        return Decision(ActionKind.HOLD, h, f"evicting host {h} would leave {after} live replica(s), "
                                            f"below min_replicas {view.min_replicas}")
    # 4. The hourly budget.
    recent = [t for t in view.evictions_at if view.now - t < HOUR_S]
    if len(recent) >= settings.max_evictions_per_hour:
        return Decision(ActionKind.HOLD, h, f"{len(recent)} eviction(s) in the last hour reach the limit of "
                                            f"{settings.max_evictions_per_hour}")
    # 5. Somewhere to go.
    if view.free_spares < 1:
        return Decision(ActionKind.HOLD, h, f"no free spare can take host {h}'s work")
    why = f"({finding.kind.value}, confidence {finding.confidence:.2f}, {view.free_spares} free spare(s), " \
          f"{len(recent)} eviction(s) in the last hour)"
    # 6. Dry-run only says so.
    if settings.dry_run:
        return Decision(ActionKind.DRY_RUN, h, f"dry-run: would evict host {h} {why}")
    # 7. Act.
    return Decision(ActionKind.EVICT, h, f"evict host {h} {why}")

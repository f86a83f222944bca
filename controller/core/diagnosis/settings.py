"""Diagnosis settings: one frozen dataclass, units in the names, one validate()."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DiagnosisSettings:
    #: Analyze telemetry and digests at all (False: reports are still accepted, nothing is found).
    enabled: bool = True
    #: Findings and decisions are made and shown, but no host is cordoned or swapped.
    dry_run: bool = False
    #: How often the hang analysis runs (straggler windows and digests are judged as they come).
    analysis_interval_s: float = 5.0
    #: A rank whose last telemetry is older than this is "silent": what it last said may be stale.
    telemetry_stale_s: float = 20.0
    #: A collective some rank joined this long ago and nobody completed is a hang. Keep it below
    #: the runtime's own timeouts (allreduce_timeout_s, 30 s by default): past them the peers give
    #: up on a stuck collective and only the rank that hangs is left to see.
    hang_after_s: float = 20.0
    #: A rank that has completed no collective yet is starting (imports, connections, a loaded
    #: host): for this long after its telemetry began, the collectives it is in or is awaited
    #: in are not judged (after it, a rank that hangs while starting is found like any other).
    startup_grace_s: float = 60.0
    #: A rank is a straggler when its own time was flagged in at least the fraction
    #: straggler_windows / straggler_of_windows of its group's windows (and in at least
    #: straggler_windows of them), counted over the longer of its last `straggler_of_windows`
    #: windows and the windows judged in the last `straggler_min_span_s` seconds, once the group
    #: was judged that long: one slow window is noise, and at fast steps so are a few (at 0.1 s
    #: steps a finding needs 31 flags in 51 windows; at steps of 1.25 s or more the window count
    #: governs). 0 s: the window count alone.
    straggler_windows: int = 3
    straggler_of_windows: int = 5
    straggler_min_span_s: float = 5.0
    #: A window flags a member whose own time exceeds the group's median by more than
    #: straggler_mad_k robust standard deviations (1.4826 x MAD), by more than
    #: straggler_min_excess of the median, and by more than straggler_min_excess_s (the
    #: sub-millisecond own times of FTAR groups jitter by far more than 8 %).
    straggler_mad_k: float = 6.0
    straggler_min_excess: float = 0.08
    straggler_min_excess_s: float = 0.002
    #: How long a window waits for all its members before it is judged with those it has.
    straggler_window_wait_s: float = 60.0
    #: A host in the minority of a digest comparison this many times within sdc_window_s is
    #: evicted; a mismatch spread over more than sdc_max_hosts hosts looks like a software
    #: divergence and names nobody.
    sdc_evict_after: int = 2
    sdc_window_s: float = 86400.0
    sdc_max_hosts: int = 2
    #: Findings below this confidence are reported, never acted on.
    min_confidence: float = 0.5
    #: At most this many evictions per hour (sliding), and never below the job's min_replicas.
    max_evictions_per_hour: int = 2
    #: A finding held by a limit (no spare, the hourly budget) is decided again until it is
    #: this old; then it stays a report.
    hold_s: float = 900.0
    #: Findings kept for the status API (newest last).
    recent_findings: int = 1000

    def validate(self) -> "DiagnosisSettings":
        problems = []
        for name in ("analysis_interval_s", "telemetry_stale_s", "hang_after_s", "startup_grace_s",
                     "straggler_window_wait_s",
                     "sdc_window_s", "straggler_mad_k"):
            if not getattr(self, name) > 0:
                problems.append(f"diagnosis.{name} must be positive, got {getattr(self, name)}.")
        if not 1 <= self.straggler_windows <= self.straggler_of_windows <= 64:
            problems.append(f"diagnosis.straggler_windows ({self.straggler_windows}) must be at least 1 and at most "
                            f"straggler_of_windows ({self.straggler_of_windows}), which is at most 64.")
        if not 0 <= self.straggler_min_excess <= 10:
            problems.append(f"diagnosis.straggler_min_excess must be 0..10 (a fraction of the median), "
                            f"got {self.straggler_min_excess}.")
        for name, most in (("straggler_min_span_s", 3600.0), ("straggler_min_excess_s", 60.0)):
            if not 0 <= getattr(self, name) <= most:
                problems.append(f"diagnosis.{name} must be 0..{most:g} s, got {getattr(self, name)}.")
        if not 0 <= self.min_confidence <= 1:
            problems.append(f"diagnosis.min_confidence must be 0..1, got {self.min_confidence}.")
        for name in ("sdc_evict_after", "sdc_max_hosts", "recent_findings"):
            if getattr(self, name) < 1:
                problems.append(f"diagnosis.{name} must be at least 1, got {getattr(self, name)}.")
        if self.max_evictions_per_hour < 0:
            problems.append(f"diagnosis.max_evictions_per_hour must not be negative, got {self.max_evictions_per_hour}.")
        if self.hold_s < 0:
            problems.append(f"diagnosis.hold_s must not be negative, got {self.hold_s}.")
        if problems:
            raise ValueError(" ".join(problems))
        return self

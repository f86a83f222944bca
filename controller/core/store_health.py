"""When does a leader whose store writes keep failing step down? A pure rule, time passed in.

A leader that cannot write cannot keep its promises (every answer waits for its write), but it
still holds the lease, so no standby can take over: it must step down itself (health
NOT_SERVING, lease released) and let a standby, which starts from what the store really holds,
try. One failure is not enough (etcd restarts, elections); `failures` in a row, or failing for
`failing_s` since the first of them, is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WriteStreak:
    failures: int = 0
    #: when the first failure of the current streak happened (None: the last write worked)
    since: float | None = None
    last_error: str = ""

    def succeeded(self) -> None:
        self.failures, self.since, self.last_error = 0, None, ""

    def failed(self, error: str, now: float) -> None:
        self.failures += 1
        self.since = now if self.since is None else self.since
        self.last_error = error

    def step_down_reason(self, now: float, *, max_failures: int, max_failing_s: float) -> str | None:
        """Why the leader must step down now, or None."""
        if self.since is None:
            return None
        if self.failures >= max_failures:
            return f"{self.failures} store writes failed in a row (limit {max_failures}); last: {self.last_error}"
        if now - self.since >= max_failing_s:
            return (f"store writes have failed for {now - self.since:.1f}s (limit {max_failing_s:g}s); "
                    f"last: {self.last_error}")
        return None

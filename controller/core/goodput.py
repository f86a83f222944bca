"""Live goodput of a job: effective training time, step rate, time to detect and to recover.

Pure: the state feeds it what happened with the time it happened (`now`), and asks for a
view at a time it chooses. Nothing here reads a clock.

Definitions (docs/operations.md repeats them for operators):

- A replica's *covered time* is the time its committed, trained steps took. A commit covers
  the replica's reported step time, but never more than the time since the later of its
  previous commit and the quorum it joined (so nothing is counted twice, and waiting in a
  round or being dead is never covered). A catch-up step trains nothing: it covers 0 s.
- *Wall time* runs from the job's start (its first join) to `now`.
- A commit that a rollback or a roll forward abandons (its step is off the history the job
  goes on with) trained for nothing: its covered time is taken back (counted as *abandoned*).
  The last RECENT_COMMITS trained commits of each replica are kept for that, in memory only:
  after a takeover only later commits can be taken back.
- A replica's *effective training ratio* is its covered time over wall time. The job's is the
  sum of every replica's covered time over (configured replicas × wall time): the fraction of
  the job's replica-time that trained, the paper's "effective training time".
- The *committed step rate* counts advances of the job's committed step (the highest step any
  replica committed) over the last `window_s` seconds.
- *Time to detect* a failure is from the replica's last sign of life (heartbeat, report, join)
  to the moment the controller declared it DEAD: an upper bound of the true detection delay.
  *Time to recover* is from that declaration to the replica being HEALTHY again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: How many finished or open failures are kept for the status API.
RECENT_FAILURES = 50
#: Chart samples kept (one per `SAMPLE_EVERY_S` at most, plus every change of healthy count and
#: both edges of every pause of `PAUSE_EDGE_S` or more).
HISTORY_SAMPLES = 720
#: Trained commits remembered per replica, newest last, so an abandoned branch can be taken back.
RECENT_COMMITS = 4096
SAMPLE_EVERY_S = 1.0
#: A pause of the committed step this long or longer has both its edges in the chart samples
#: (the last advance before it and the first after), so controller.core.stalls measures it exactly.
PAUSE_EDGE_S = SAMPLE_EVERY_S


@dataclass
class ReplicaGoodput:
    covered_s: float = 0.0
    commits: int = 0
    #: start of the time the next commit may cover (None: not training, e.g. dead)
    since: float | None = None
    healthy: bool = False
    #: when the open failure was declared (None: no failure open)
    down_since: float | None = None
    failures: int = 0
    #: covered time taken back because a rollback or roll forward abandoned its commits
    abandoned_s: float = 0.0
    #: (step, covered seconds) of recent trained commits, in the order they came
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_COMMITS))


@dataclass(frozen=True)
class Observation:
    """A value for a histogram: `what` is "step", "detect" or "recover"."""

    what: str
    seconds: float
    cause: str = ""


@dataclass
class Failure:
    replica: str
    cause: str
    died_at: float
    detect_s: float
    recovered_at: float | None = None
    recover_s: float | None = None


@dataclass(frozen=True)
class GoodputView:
    started_at: float | None
    wall_s: float
    committed_step: int
    effective_training_ratio: float
    committed_steps_per_s: float
    window_s: float
    healthy: int
    replicas: dict = field(default_factory=dict)
    recent_failures: tuple = ()


class GoodputTracker:
    def __init__(self, replicas_total: int, window_s: float = 60.0) -> None:
        self.replicas_total = replicas_total
        self.window_s = window_s
        self.started_at: float | None = None
        self.committed_step = -1
        self.replicas: dict[str, ReplicaGoodput] = {}
        self.failures: deque[Failure] = deque(maxlen=RECENT_FAILURES)
        self.history: deque[tuple[float, int, int]] = deque(maxlen=HISTORY_SAMPLES)
        self._advances: deque[float] = deque()
        #: when the committed step last advanced (None: not since this tracker started)
        self._last_advance_at: float | None = None
        self._observations: list[Observation] = []

    # -- what happened -------------------------------------------------------------------

    def on_join(self, replica_id: str, now: float) -> None:
        if self.started_at is None:
            self.started_at = now
        self._replica(replica_id)

    def on_quorum(self, member_ids, now: float) -> None:
        for rid in member_ids:
            g = self._replica(rid)
            if g.since is None:
                g.since = now

    def on_commit(self, replica_id: str, step: int, step_time_s: float | None, trained: bool, now: float) -> None:
        """A replica committed `step`; `trained` is False for a catch-up step."""
        g = self._replica(replica_id)
        g.commits += 1
        if trained and g.since is not None:
            interval = max(now - g.since, 0.0)
            covered = min(step_time_s, interval) if step_time_s and step_time_s > 0 else interval
            g.covered_s += covered
            g.recent.append((step, covered))
            self._observations.append(Observation("step", covered))
        g.since = now
        if step > self.committed_step:
            paused = self._last_advance_at is not None and now - self._last_advance_at >= PAUSE_EDGE_S
            if paused:
                self._sample_last_advance()
            self.committed_step = step
            self._last_advance_at = now
            self._advances.append(now)
            self._prune(now)
            self._sample(now, changed=paused)

    def on_abandoned(self, replica_ids, from_step: int) -> float:
        """The history goes on without these replicas' commits of `from_step` and later (a
        rollback below them, or a roll forward past the branch they were on): their covered
        time is taken back. Returns the seconds taken back."""
        total = 0.0
        for rid in replica_ids:
            g = self.replicas.get(rid)
            while g is not None and g.recent and g.recent[-1][0] >= from_step:
                _, covered = g.recent.pop()
                g.covered_s = max(g.covered_s - covered, 0.0)
                g.abandoned_s += covered
                total += covered
        return total

    def on_state(self, replica_id: str, healthy: bool, dead: bool, cause: str, last_seen: float,
                 now: float) -> None:
        """A replica changed state (healthy: now HEALTHY; dead: now DEAD)."""
        g = self._replica(replica_id)
        was_healthy = g.healthy
        g.healthy = healthy
        if dead:
            g.since = None
            if g.down_since is None:
                g.down_since = now
                g.failures += 1
                detect = max(now - last_seen, 0.0)
                self.failures.append(Failure(replica_id, cause, now, round(detect, 3)))
                self._observations.append(Observation("detect", detect, cause))
        elif healthy and g.down_since is not None:
            recover = max(now - g.down_since, 0.0)
            g.down_since = None
            for f in reversed(self.failures):
                if f.replica == replica_id and f.recovered_at is None:
                    f.recovered_at, f.recover_s = now, round(recover, 3)
                    break
            self._observations.append(Observation("recover", recover))
        if healthy != was_healthy:
            self._sample_last_advance()
            self._sample(now, changed=True)

    def timeline(self) -> list[tuple[float, int, int]]:
        """The chart samples, with the last advance of the committed step appended when no
        sample holds it yet: what controller.core.stalls reads."""
        last = self._unsampled_advance()
        return list(self.history) + ([last] if last else [])

    def take_observations(self) -> list[Observation]:
        out, self._observations = self._observations, []
        return out

    # -- what it means -------------------------------------------------------------------

    def view(self, now: float) -> GoodputView:
        wall = max(now - self.started_at, 0.0) if self.started_at is not None else 0.0
        self._prune(now)
        window = min(self.window_s, wall)
        total = sum(g.covered_s for g in self.replicas.values())
        denominator = max(self.replicas_total, 1) * wall
        return GoodputView(
            started_at=self.started_at, wall_s=round(wall, 3), committed_step=self.committed_step,
            effective_training_ratio=round(min(total / denominator, 1.0), 4) if denominator > 0 else 0.0,
            committed_steps_per_s=round(len(self._advances) / window, 4) if window > 0 else 0.0,
            window_s=self.window_s, healthy=sum(g.healthy for g in self.replicas.values()),
            replicas={rid: {"effective_training_ratio": round(min(g.covered_s / wall, 1.0), 4) if wall > 0 else 0.0,
                            "covered_s": round(g.covered_s, 3), "abandoned_s": round(g.abandoned_s, 3),
                            "commits": g.commits, "failures": g.failures}
                      for rid, g in sorted(self.replicas.items())},
            recent_failures=tuple(dict(f.__dict__) for f in self.failures),
        )

    # -- durable snapshot ----------------------------------------------------------------

    def snapshot(self) -> dict:
        """Small: written with the replicas on every commit."""
        return {"started_at": self.started_at, "committed_step": self.committed_step,
                "replicas": {rid: [g.covered_s, g.commits, g.failures, g.down_since, g.abandoned_s]
                             for rid, g in self.replicas.items()}}

    def snapshot_history(self) -> dict:
        """Chart samples and recent failures: written behind, with the journal."""
        return {"history": [list(s) for s in self.history], "failures": [list(f.__dict__.values()) for f in self.failures]}

    def restore(self, snapshot: dict | None, history: dict | None, now: float) -> None:
        """Load what a previous leader wrote. Open intervals restart at `now`: a failover's
        own pause is not covered."""
        if snapshot:
            self.started_at = snapshot["started_at"]
            self.committed_step = snapshot["committed_step"]
            for rid, (covered, commits, failures, down_since, *abandoned) in snapshot["replicas"].items():
                self.replicas[rid] = ReplicaGoodput(covered, commits, None, False, down_since, failures,
                                                    abandoned[0] if abandoned else 0.0)
        if history:
            self.history.extend(tuple(s) for s in history["history"])
            self.failures.extend(Failure(*f) for f in history["failures"])

    # -- internals -----------------------------------------------------------------------

    def _replica(self, replica_id: str) -> ReplicaGoodput:
        g = self.replicas.get(replica_id)
        if g is None:
            g = self.replicas[replica_id] = ReplicaGoodput()
        return g

    def _prune(self, now: float) -> None:
        while self._advances and self._advances[0] <= now - self.window_s:
            self._advances.popleft()

    def _unsampled_advance(self) -> tuple[float, int, int] | None:
        """The last advance of the committed step as a sample, if no sample holds it yet (the
        healthy count then is the last sample's: every change of it is sampled at once)."""
        t = self._last_advance_at
        if t is not None and self.history and self.history[-1][0] < t:
            return (t, self.committed_step, self.history[-1][2])
        return None

    def _sample_last_advance(self) -> None:
        """Before a sample that may follow a pause: keep the pause's start."""
        last = self._unsampled_advance()
        if last:
            self.history.append(last)

    def _sample(self, now: float, changed: bool) -> None:
        if changed or not self.history or now - self.history[-1][0] >= SAMPLE_EVERY_S:
            self.history.append((now, self.committed_step, sum(g.healthy for g in self.replicas.values())))


class NoGoodput(GoodputTracker):
    """Telemetry switched off: nothing is tracked (the benchmarks' baseline)."""

    def on_join(self, replica_id, now): pass  # noqa: E704
    def on_quorum(self, member_ids, now): pass  # noqa: E704
    def on_commit(self, replica_id, step, step_time_s, trained, now): pass  # noqa: E704
    def on_state(self, replica_id, healthy, dead, cause, last_seen, now): pass  # noqa: E704
    def on_abandoned(self, replica_ids, from_step): return 0.0  # noqa: E704

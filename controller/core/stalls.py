"""When the job stood still: pauses of the committed step, and the failures behind them.

Pure: it reads the timeline the goodput tracker keeps and the recent quorums, with the end of
the time to look at (`until`) passed in. Nothing here reads a clock.

- A *pause* runs from the moment the job's committed step reached a value to the moment it
  next went higher; the last one runs to `until` (now while the job runs, its end once it is
  over) and is *ongoing* while the job runs. The tracker's timeline holds both edges of every
  pause of `PAUSE_EDGE_S` (1 s) or more (controller.core.goodput), so those are exact; shorter
  ones between two kept samples are not seen. Pauses before the first commit (startup) are
  not counted, nor one that a jump of the committed step by more than one ends (a roll
  forward: it cannot be told from advances faster than the samples).
- The *typical step* is the median time per committed step over the samples: the job's pace.
- A *stall* is a pause of at least `min_stall_s` and at least `STALL_FACTOR` typical steps:
  the job stood still, not training at its pace.
- A failure's *window* runs from the failed replica's last sign of life to its declaration
  (`died_at - detect_s` .. `died_at`): the failure happened in it. A stall names the failures
  whose windows overlap it. A failure is given the longest pause that overlaps its window:
  how long the survivors stood still around it, whether or not that is long enough to be a
  stall; it may be far longer than the failed replica's own time to recover.
- A stall names the last quorum formed inside it: the one the job went on with.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

#: A stall is at least this many typical steps long.
STALL_FACTOR = 3.0
#: ... and at least this long (seconds).
MIN_STALL_S = 1.0


@dataclass(frozen=True)
class Pause:
    start: float
    end: float
    #: the committed step the job stood at
    step: int
    ongoing: bool

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Stall:
    pause: Pause
    #: (replica, died_at) of the failures whose windows overlap it, oldest first
    failures: tuple[tuple[str, float], ...]
    #: the last quorum formed inside it, or 0 and "" when none did
    quorum_id: int
    quorum_reason: str


@dataclass(frozen=True)
class FailureStall:
    failure: Mapping
    #: the longest pause overlapping the failure's window (None: the timeline does not reach it)
    pause: Pause | None


@dataclass(frozen=True)
class StallReport:
    typical_step_s: float | None
    #: the shortest pause that is a stall
    threshold_s: float
    stalls: tuple[Stall, ...]
    failures: tuple[FailureStall, ...]


def pauses(samples: Sequence[Sequence[float]], until: float, running: bool = True) -> list[Pause]:
    """Every pause of the committed step in `samples` ((time, committed step, healthy), oldest
    first, as GoodputTracker.timeline gives them), the last one to `until`, ongoing while the
    job is `running`.

    The first sample holding a step is at the moment the step was reached (the tracker keeps
    the last advance before any sample that follows it). Between that sample and the first
    holding a higher step the job stood still only if the step went up by exactly one: a
    larger rise means advances came faster than samples are kept (less than PAUSE_EDGE_S
    apart), so no pause that long is in between."""
    out: list[Pause] = []
    step, since = None, None
    for t, s, *_ in samples:
        if step is None or s > step:
            if step is not None and step >= 0 and s == step + 1:
                out.append(Pause(since, t, int(step), False))
            step, since = s, t
    if step is not None and step >= 0 and until > since:
        out.append(Pause(since, until, int(step), running))
    return out


def typical_step_s(samples: Sequence[Sequence[float]]) -> float | None:
    """The median seconds per committed step between samples where the step advanced."""
    rates = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(samples, samples[1:])
             if b[1] > a[1] >= 0 and b[0] >= a[0]]
    return statistics.median(rates) if rates else None


def _overlaps(p: Pause, start: float, end: float) -> bool:
    return p.start <= end and start <= p.end


def _window(failure: Mapping) -> tuple[float, float]:
    died = float(failure["died_at"])
    return died - max(float(failure.get("detect_s") or 0.0), 0.0), died


def find_stalls(samples: Sequence[Sequence[float]], failures: Iterable[Mapping],
                quorums: Iterable[tuple[float, int, str]], until: float, running: bool,
                min_stall_s: float = MIN_STALL_S) -> StallReport:
    """`failures`: mappings with `replica`, `died_at` and `detect_s` (the goodput view's
    recent failures, oldest first); `quorums`: (formed_at, quorum_id, reason), oldest first;
    `running`: False once the job is over (its last pause is then not ongoing)."""
    found = pauses(samples, until, running)
    typical = typical_step_s(samples)
    threshold = max(min_stall_s, STALL_FACTOR * typical) if typical is not None else min_stall_s
    failures = list(failures)
    quorums = sorted(quorums)
    stalls = []
    for p in found:
        if p.seconds < threshold:
            continue
        hit = tuple((f["replica"], float(f["died_at"])) for f in failures if _overlaps(p, *_window(f)))
        inside = [q for q in quorums if p.start < q[0] <= p.end]
        qid, reason = (inside[-1][1], inside[-1][2]) if inside else (0, "")
        stalls.append(Stall(p, hit, qid, reason))
    given = []
    for f in failures:
        around = [p for p in found if _overlaps(p, *_window(f))]
        given.append(FailureStall(f, max(around, key=lambda p: p.seconds) if around else None))
    return StallReport(typical, threshold, tuple(stalls), tuple(given))

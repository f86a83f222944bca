"""Who led when: each controller's own record of becoming the leader and stepping down, and
the check that no two controllers acted as leader at once.

    lines = leadership_lines(Path("controller-a.log"))   # its JSON "leader" event lines
    spans = leader_spans({"a": lines_a, "b": lines_b}, killed={"a": [t]}, end=t_end)
    overlaps(spans)                                       # [] when fencing held

A controller writes "controller X became the leader" when it takes the lease and "controller X
stepped down: why" when it lets it go (both in its event log on stderr, stamped by its clock:
on one machine every controller reads the same clock). One SIGKILLed while leading writes no
step-down: its span ends at the kill. Everything but `leadership_lines` is pure.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

BECAME = "became the leader"
STEPPED_DOWN = "stepped down"


def leadership_lines(path: Path | None) -> list[dict]:
    """The "leader" events in a controller's log, in order: {"at": unix seconds, "message": ...}."""
    if path is None or not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{") or '"kind": "leader"' not in line:
            continue
        try:
            e = json.loads(line)
            at = datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError):
            continue
        out.append({"at": at, "message": e["message"]})
    return out


def leader_spans(lines: dict[str, list[dict]], killed: dict[str, list[float]], end: float) -> list[tuple[str, float, float]]:
    """(controller, from, until) for every time a controller led: from its "became" to its
    next "stepped down", its next kill, or `end`, whichever comes first."""
    spans = []
    for name, events in lines.items():
        kills = sorted(killed.get(name, []))
        start = None
        for e in sorted(events, key=lambda e: e["at"]):
            if BECAME in e["message"]:
                if start is not None:  # led again without a step-down: killed in between (or a restart)
                    spans.append((name, start, _first_after(kills, start, e["at"])))
                start = e["at"]
            elif STEPPED_DOWN in e["message"] and start is not None:
                spans.append((name, start, _first_after(kills, start, e["at"])))
                start = None
        if start is not None:
            spans.append((name, start, _first_after(kills, start, end)))
    return sorted(spans, key=lambda s: s[1])


def _first_after(kills: list[float], start: float, until: float) -> float:
    return min([k for k in kills if start <= k <= until] + [until])


def overlaps(spans: list[tuple[str, float, float]]) -> list[str]:
    """A sentence for every two spans of different controllers that overlap."""
    found = []
    for i, (a, a0, a1) in enumerate(spans):
        for b, b0, b1 in spans[i + 1:]:
            if a != b and b0 < a1 and a0 < b1:
                found.append(f"controllers {a} and {b} both acted as leader from {max(a0, b0):.3f} to "
                             f"{min(a1, b1):.3f} ({min(a1, b1) - max(a0, b0):.3f}s): fencing did not hold")
    return found

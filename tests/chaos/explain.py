"""What a chaos run's record says happened, so that a violation seen once can be explained from
the record alone (pure: text in, rows out; the executor reads the files).

    errors = trainer_errors(agent_log_text, "h1")     # each trainer traceback in an agent's log
    rows = swaps(recorded.events)                      # each swap and cordon, with its reason
    lines = timeline(recorded, errors)                 # faults, exclusions, swaps, errors: in order

- Trainer errors come from the trainers' own tracebacks: an agent copies each trainer's stderr
  into its log, every line prefixed with the trainer's label (`[h1 r2/0] `, agent/process.py),
  and reports the exit to the controller with only the last line. A traceback says what was
  raised (its last line) and where: the innermost frame of the last exception in the chain
  (`where`), and, when it was raised while handling another one, that first exception and its
  frame (`cause`): "OSError at fthsdp/x.py:12 in f, while handling ChannelError at ...". Its
  time is that of the agent's next line about that trainer (its exit, its stop) when one follows
  within a few lines, else the last stamped line before it (agent logs stamp local time).
- Swaps and cordons come from the controller's event journal (REST /api/v1/events); the
  reason is the event's message (a swap names the failure that cordoned the host it replaces:
  controller/core/hosts.py `_swap`).
- The timeline is one short line per thing that matters, seconds from the run's start: a fault
  injected (what was done), its last action, the job whole again; deaths, host deaths and
  departures, hosts returning after repair, swaps, cordons, leaders, rollbacks; every trainer
  error with its where.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.chaos.executor import Recorded

#: `[h1 r2/0] ...`: a trainer's stderr line in its agent's log (the label may be `h1 standby0`)
_LABELLED = re.compile(r"^\[(?P<host>\S+) (?P<trainer>[^\]]+)\] ?(?P<text>.*)$")
#: torch's prefix on a rank's traceback lines (`[rank1]: `)
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
#: how many lines after a traceback the agent's line about that trainer may come
_EXIT_WITHIN = 8
#: the timeline's kinds of controller events, and which replica events it keeps
TIMELINE_KINDS = ("death", "host_death", "host_left", "swap", "cordon", "no_spare", "leader", "rollback",
                  "roll_forward", "job_stuck", "job_failed", "digest_mismatch", "diagnosis", "order_failed",
                  "replica_restart")
_KEPT_HOST_EVENTS = ("returned after repair", "taken over")
MAX_TEXT = 240


@dataclass(frozen=True)
class TrainerError:
    """One traceback a trainer wrote: what was raised, where, and (chained) what it handled."""
    at: float | None     # epoch seconds (see the module docstring), None: no stamped line near it
    host: str
    trainer: str         # "r2/0" (replica/rank) or the agent's slot label
    text: str            # the last line: "OSError: [Errno 98] Address already in use"
    where: str           # its innermost frame: "fthsdp/step/client.py:158 in receive"
    called_from: str = ""  # raised outside this repository (torch): the innermost frame of ours
    cause: str = ""      # the first exception of a chain and its frame, "" when not chained
    ended: str = ""      # the agent's line about the trainer that followed it (its exit, its stop)

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        line = f"{self.host} {self.trainer}: {self.text} at {self.where}"
        line += f" (called from {self.called_from})" if self.called_from else ""
        return line + (f", while handling {self.cause}" if self.cause else "")


def _stamp(line: str) -> float | None:
    m = _STAMP.match(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


_OURS = ("fthsdp/", "controller/", "agent/", "ftar_kernels/", "protos/", "tests/", "bench/")


def _short_path(path: str) -> str:
    """A repository file as its path from the repository (`fthsdp/x.py`), an installed one from
    its site-packages (`torch/distributed/x.py`), others as they are."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    for top in _OURS:
        i = path.rfind("/" + top)
        if i >= 0:
            return path[i + 1:]
    return path


def _ours(frame: str) -> bool:
    return frame.startswith(_OURS)


@dataclass
class _Block:
    """A traceback being read: its chain of (exception line, innermost frame, innermost of ours)."""
    start: int
    chain: list[tuple[str, str, str]]
    last: int = 0          # the index of its last line so far
    frame: str = ""
    our_frame: str = ""
    reading: bool = True   # inside a "Traceback ..." section (frames, then the exception line)
    chained: bool = False  # a "During handling ..." line came after its last exception line


def trainer_errors(log: str, host: str) -> list[TrainerError]:
    """Every trainer traceback in agent `host`'s log text, in order."""
    lines = log.splitlines()
    open_blocks: dict[str, _Block] = {}
    done: list[tuple[str, _Block]] = []
    last_stamp: list[tuple[int, float]] = []
    for i, raw in enumerate(lines):
        m = _LABELLED.match(raw)
        if m is None:
            t = _stamp(raw)
            if t is not None:
                last_stamp.append((i, t))
            continue
        trainer, text = m.group("trainer"), _RANK_PREFIX.sub("", m.group("text"))
        t = _stamp(text)
        if t is not None:
            last_stamp.append((i, t))
        block = open_blocks.get(trainer)
        if text.startswith("Traceback (most recent call last)"):
            if block is not None and not block.reading and not block.chained:  # a traceback of its own
                done.append((trainer, open_blocks.pop(trainer)))
                block = None
            if block is None:
                block = open_blocks[trainer] = _Block(i, [])
            block.reading, block.chained, block.frame, block.our_frame, block.last = True, False, "", "", i
            continue
        if block is None:
            continue
        if not block.reading and text.strip() and not text.startswith(_CHAINED):
            done.append((trainer, open_blocks.pop(trainer)))
            continue
        block.last = i
        block.chained = block.chained or text.startswith(_CHAINED)
        frame = _FRAME.match(text)
        if frame and block.reading:
            block.frame = f"{_short_path(frame.group('path'))}:{frame.group('line')} in {frame.group('func')}"
            block.our_frame = block.frame if _ours(block.frame) else block.our_frame
        elif block.reading and text and not text[0].isspace():
            block.chain.append((text.strip(), block.frame, "" if _ours(block.frame) else block.our_frame))
            block.reading = False  # what follows is a link of a chain, or the end
    done += list(open_blocks.items())
    out = []
    for trainer, block in sorted(done, key=lambda d: d[1].start):
        end = block.last
        if not block.chain:
            continue
        text, where, called_from = block.chain[-1]
        first_text, first_where, _ = block.chain[0]
        cause = f"{_clip(first_text)} at {first_where}" if len(block.chain) > 1 else ""
        ended, at = _ended(lines, end, host, trainer)
        if at is None:
            at = next((t for j, t in reversed(last_stamp) if j <= end), None)
        out.append(TrainerError(at, host, trainer, _clip(text), where, called_from, cause, ended))
    return out


def _ended(lines: list[str], end: int, host: str, trainer: str) -> tuple[str, float | None]:
    """The agent's line about `trainer` soon after line `end` (`replica r2 rank 0: ...`)."""
    rid, _, rank = trainer.partition("/")
    about = f"agent[{host}] "
    tag = f"replica {rid} rank {rank}:"
    for line in lines[end + 1:end + 1 + _EXIT_WITHIN]:
        if about in line and tag in line:
            return _clip(line.split(tag, 1)[1].strip()), _stamp(line)
    return "", None


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def swaps(events: list[dict]) -> list[dict]:
    """Each swap and cordon the controller recorded: when, what, on which host, and why."""
    return [{"at": e["at"], "kind": e["kind"], "host": e["subject"], "reason": e["message"]}
            for e in events if e["kind"] in ("swap", "cordon", "no_spare")]


def timeline(rec: "Recorded", errors: list[TrainerError], faults: list[dict] = ()) -> list[str]:
    """The run in short lines, seconds from its start (`+12.3s ...`), in order: the faults
    (injected, last action, job whole again; `faults`: the network's fault records, began and
    healed), the controller's deaths, swaps, cordons and leaders (TIMELINE_KINDS, a host back
    after repair, a replica HEALTHY again), and the trainer errors with where they were raised."""
    rows: list[tuple[float, int, str]] = []

    def add(t: float | None, text: str, order: int = 1) -> None:
        if t is not None:
            rows.append((t, order, _clip(text, 2 * MAX_TEXT)))

    for inj in rec.injections:
        add(inj.at, f"fault {inj.scheduled}: {'; '.join(inj.detail[:1]) or 'injected'}", 0)
        if inj.done_at is not None and inj.done_at > inj.at:
            add(inj.done_at, f"fault {inj.scheduled} done: {'; '.join(inj.detail[1:]) or 'its last action'}", 0)
        add(inj.settled_at, f"fault {inj.scheduled} settled: every replica HEALTHY again", 2)
    for f in faults:
        add(f.get("began_at"), f"network: {f['detail']}", 0)
        add(f.get("ended_at"), f"network: healed {f['detail']}", 0)
    for e in rec.events:
        kind, msg = e["kind"], e["message"]
        if kind in TIMELINE_KINDS or (kind == "host" and any(k in msg for k in _KEPT_HOST_EVENTS)) or (
                kind == "replica" and "became HEALTHY" in msg):
            cause = f" [{e['cause']}]" if e.get("cause") else ""
            add(e["at"], f"{kind}{cause}: {msg}")
    for err in errors:
        add(err.at, f"trainer error {err.describe()}" + (f" -> {err.ended}" if err.ended else ""))
    return [f"+{t - rec.started_at:.1f}s {text}" for t, _, text in sorted(rows, key=lambda r: (r[0], r[1]))]

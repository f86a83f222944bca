"""The structured event log: every controller event as one JSON line, at its level.

Lines go to the logger `fthsdp.events`; `configure(destination)` gives that logger its own
handler that writes the JSON alone (no text prefix), to stderr or a file, so a log shipper
can parse every line. One line looks like:

    {"ts": "2026-05-01T12:00:03.120Z", "level": "warning", "job_id": "llm", "seq": 42,
     "kind": "death", "subject": "r1", "cause": "trainer_exit",
     "message": "replica r1 became DEAD: trainer rank 0 on host h1 died (signal 9)"}
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

from controller.core.model import Event

LOGGER = "fthsdp.events"
log = logging.getLogger(LOGGER)
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def iso_time(at: float) -> str:
    """An event's time as the log writes it (`ts`; the REST events carry it beside `at`)."""
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_line(job_id: str, e: Event) -> str:
    ts = iso_time(e.at)
    return json.dumps({"ts": ts, "level": e.level, "job_id": job_id, "seq": e.seq, "kind": e.kind,
                       "subject": e.subject, "cause": e.cause, "message": e.message}, ensure_ascii=False)


def emit(job_id: str, events: list[Event]) -> None:
    for e in events:
        level = _LEVELS.get(e.level, logging.INFO)
        if log.isEnabledFor(level):
            log.log(level, "%s", event_line(job_id, e))


def configure(destination: str, level: str = "INFO") -> None:
    """`stderr`, `off`, or a file path (appended to). The event log keeps its own level, so
    `--log-level WARNING` quiets the text log without losing info events."""
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    log.propagate = False
    if destination == "off":
        log.disabled = True
        return
    log.disabled = False
    log.setLevel(level.upper())
    handler = logging.StreamHandler(sys.stderr) if destination == "stderr" else logging.FileHandler(destination)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)

"""Small helpers for agent tests: bounded condition waits and ready-file readers."""

from __future__ import annotations

import glob
import json
import os
import sys
from tests.waiting import wait_for, wait_for_async  # noqa: F401 - re-exported for the agent tests

FAKE_TRAINER = os.path.join(os.path.dirname(__file__), "fake_trainer.py")


def ready_files(ready_dir: str, replica: str = "*", rank: str = "*") -> list[dict]:
    """Ready files of trainers (oldest first), parsed."""
    paths = glob.glob(os.path.join(str(ready_dir), f"ready-{replica}-{rank}-*.json"))
    out = []
    for path in paths:
        with open(path) as f:
            out.append(json.load(f))
    return sorted(out, key=lambda v: v["time"])


def standby_files(ready_dir: str) -> list[dict]:
    out = []
    for path in glob.glob(os.path.join(str(ready_dir), "standby-*.json")):
        with open(path) as f:
            out.append(json.load(f))
    return out


def trainer_command(ready_dir: str, *flags: str) -> tuple[str, ...]:
    return (sys.executable, FAKE_TRAINER, str(ready_dir), *flags)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or being reaped as we look (ESRCH)
        return False

"""Small helpers for agent tests: bounded condition waits and ready-file readers."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import sys
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

FAKE_TRAINER = os.path.join(os.path.dirname(__file__), "fake_trainer.py")


async def wait_for(predicate: Callable[[], T], timeout_s: float, what: str,
                   every_s: float = 0.02) -> T:
    """Poll `predicate` until it returns something truthy; fail naming `what` after timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


async def wait_for_async(predicate: Callable[[], Awaitable[T]], timeout_s: float, what: str,
                         every_s: float = 0.1) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


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
    except FileNotFoundError:
        return False

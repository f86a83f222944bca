"""Bounded waits on conditions, shared by the test suites (never a bare sleep for an effect)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


async def wait_for(predicate: Callable[[], T], timeout_s: float = 10.0, what: str = "condition",
                   every_s: float = 0.02) -> T:
    """Poll `predicate` until it returns something truthy; fail naming `what` after timeout."""
    return await wait_for_async(lambda: _now(predicate), timeout_s, what, every_s)


async def wait_for_async(predicate: Callable[[], Awaitable[T]], timeout_s: float = 10.0,
                         what: str = "condition", every_s: float = 0.1) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


async def wait_for_blocking(predicate: Callable[[], T], timeout_s: float = 10.0, what: str = "condition",
                            every_s: float = 0.05) -> T:
    """The same for a predicate that blocks (HTTP, files): it runs off the event loop."""
    return await wait_for_async(lambda: asyncio.to_thread(predicate), timeout_s, what, every_s)


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str,
               every_s: float | Callable[[], float] = 0.05) -> T:
    """`wait_for` for blocking code: poll `predicate` (every `every_s`, or as often as that
    callable says after each look) until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()  # never set: its wait is the bounded pause between looks
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        pause.wait(every_s() if callable(every_s) else every_s)


async def _now(predicate: Callable[[], T]) -> T:
    return predicate()

"""Give the memory that refused requests leave freed back to the operating system.

A volley of refused calls (2 MiB strings, 9 MiB bodies, thousands of strangers' ids) leaves
nothing alive in the controller (issue 28, race 6: tracemalloc's live Python memory is flat
over 20 volleys), yet its RSS climbed ~15 % over them: glibc keeps freed chunks inside its
heaps and the gRPC threads' arenas, and returns pages to the OS only from the top of the
main heap. `malloc_trim(0)` releases the free pages anywhere in every arena.

`Trimmer` decides when (pure, the time and RSS passed in): when the RSS is `GROWTH_MIB` above
its base, at most once per `INTERVAL_S`. The base is the lowest RSS seen, raised only by a trim
that gave little back (under half of GROWTH_MIB: that memory is alive, the controller grew for
real). So a trim in the middle of a volley (much given back, more still in use) is followed by
another once the volley's buffers are freed; a controller that grows for real (more hosts)
trims once per GROWTH_MIB of growth; an idle one never.
Without glibc (musl, macOS) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("fthsdp.controller")

INTERVAL_S = 1.0
GROWTH_MIB = 4.0
_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / (1 << 20)


@dataclass
class Trimmer:
    interval_s: float = INTERVAL_S
    growth_mib: float = GROWTH_MIB
    #: the RSS after the last trim (None: not measured yet) and when it was
    base_mib: float | None = None
    last_at: float = float("-inf")

    def due(self, now: float, rss_mib: float) -> bool:
        """Trim now? The first call only measures."""
        if self.base_mib is None or rss_mib < self.base_mib:
            self.base_mib = rss_mib
            return False
        return now - self.last_at >= self.interval_s and rss_mib - self.base_mib >= self.growth_mib

    def trimmed(self, now: float, before_mib: float, after_mib: float) -> None:
        if before_mib - after_mib < self.growth_mib / 2:
            self.base_mib = after_mib  # little to give back: what is left is alive
        else:
            self.base_mib = min(self.base_mib if self.base_mib is not None else after_mib, after_mib)
        self.last_at = now


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_MIB


def malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


async def trim_freed_memory(trimmer: Trimmer | None = None, clock=time.monotonic) -> None:
    """Run for the process's life: trim when `trimmer` says so."""
    trim = malloc_trim()
    if trim is None or not os.path.exists("/proc/self/statm"):
        return
    trimmer = trimmer or Trimmer()
    while True:
        await asyncio.sleep(trimmer.interval_s)  # a pace: nothing to wait for
        now, rss = clock(), rss_mib()
        if trimmer.due(now, rss):
            trim()
            after = rss_mib()
            trimmer.trimmed(clock(), rss, after)
            log.debug("malloc_trim: RSS %.1f -> %.1f MiB", rss, after)


__all__ = ["Trimmer", "malloc_trim", "rss_mib", "trim_freed_memory"]

"""Give the memory that refused requests leave freed back to the operating system.

A volley of refused calls (2 MiB strings, 9 MiB bodies, thousands of strangers' ids) leaves
nothing alive in the controller (issue 28, race 6: tracemalloc's live Python memory is flat
over 20 volleys), yet its RSS climbed ~15 % over them: glibc keeps freed chunks inside its
heaps and the gRPC threads' arenas, and returns pages to the OS only from the top of the
main heap. `malloc_trim(0)` releases the free pages inside every arena, but not the free top
of a thread's arena, which glibc trims only on free() past its trim threshold; left dynamic,
that threshold rose to 18 MiB after the first refused 9 MiB body, so `fix_malloc_thresholds`
fixes it when the controller starts.

`Trimmer` decides when (pure, the time and RSS passed in), at most once per `INTERVAL_S`:
  * grown: the RSS is `GROWTH_MIB` above its base;
  * freed: the RSS fell `GROWTH_MIB` below its highest since the last trim (free() gave some
    pages back by itself, so more was freed, and glibc may keep the rest inside its heaps);
  * follow-up: the last trim gave much back (at least half of GROWTH_MIB: it ran in the middle
    of a volley, more is being freed), until one gives little back; or it gave little back but
    left the RSS GROWTH_MIB above the base (it may have run during a volley's last calls, freed
    a moment later without the RSS moving): once, to confirm.
The base is the lowest RSS seen, raised only by a trim that gave little back (that memory is
alive, the controller grew for real), twice in a row when that is GROWTH_MIB above it. So a
volley ends with a trim after its buffers are freed, even when a trim in its middle found its
memory alive and raised the base (without the freed rule the base then followed the RSS down
by itself and nothing was trimmed: issue 28 race 6, up to 84 against 70 MiB settled); a
controller that grows for real (more hosts) trims once per GROWTH_MIB of growth; an idle one
never.
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
MMAP_THRESHOLD = 256 << 10  # bytes: blocks this big or bigger are mapped and unmapped on their own
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / (1 << 20)


@dataclass
class Trimmer:
    interval_s: float = INTERVAL_S
    growth_mib: float = GROWTH_MIB
    #: what is taken as alive (None: not measured yet)
    base_mib: float | None = None
    #: the highest RSS since the last trim
    high_mib: float = 0.0
    last_at: float = float("-inf")
    #: the last trim gave much back, or little far above the base: trim again after the interval
    follow_up: bool = False
    doubting: bool = False

    def due(self, now: float, rss_mib: float) -> bool:
        """Trim now? The first call only measures."""
        if self.base_mib is None:
            self.base_mib = self.high_mib = rss_mib
            return False
        self.base_mib = min(self.base_mib, rss_mib)
        self.high_mib = max(self.high_mib, rss_mib)
        if now - self.last_at < self.interval_s:
            return False
        grown = rss_mib - self.base_mib >= self.growth_mib
        freed = self.high_mib - rss_mib >= self.growth_mib
        return grown or freed or self.follow_up

    def trimmed(self, now: float, before_mib: float, after_mib: float) -> None:
        base = self.base_mib if self.base_mib is not None else after_mib
        much = before_mib - after_mib >= self.growth_mib / 2
        # Little given back, GROWTH_MIB above the base: alive now, but maybe only the last calls
        # of a volley; believed once a second trim agrees.
        doubt = not much and after_mib - base >= self.growth_mib and not self.doubting
        self.follow_up, self.doubting = much or doubt, doubt
        if much or doubt:
            self.base_mib = min(base, after_mib)
        else:
            self.base_mib = after_mib  # little to give back: what is left is alive
        self.high_mib = after_mib
        self.last_at = now


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_MIB


def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where there is none."""
    libc = _glibc()
    if libc is None:
        return None
    trim = libc.malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


def fix_malloc_thresholds() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD (False where there is no glibc).

    Left dynamic, glibc raises it to the size of each mmapped block freed (up to 32 MiB) and
    the trim threshold to twice that: after one refused 9 MiB body, the next big buffers come
    from the heaps instead of mmap, and the free space at the top of a gRPC thread's arena (up
    to 18 MiB) is never given back, by free() nor by malloc_trim(), which trims only the main
    heap's top. Fixed, a big buffer is unmapped as it is freed, and each heap's top is trimmed
    past 128 KiB (glibc's default trim threshold, no longer raised)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


async def trim_freed_memory(trimmer: Trimmer | None = None, clock=time.monotonic) -> None:
    """Run for the process's life: fix glibc's thresholds, then trim when `trimmer` says so."""
    trim = malloc_trim()
    if trim is None or not os.path.exists("/proc/self/statm"):
        return
    fix_malloc_thresholds()
    trimmer = trimmer or Trimmer()
    while True:
        await asyncio.sleep(trimmer.interval_s)  # a pace: nothing to wait for
        now, rss = clock(), rss_mib()
        if trimmer.due(now, rss):
            trim()
            after = rss_mib()
            trimmer.trimmed(clock(), rss, after)
            log.debug("malloc_trim: RSS %.1f -> %.1f MiB", rss, after)


__all__ = ["MMAP_THRESHOLD", "Trimmer", "fix_malloc_thresholds", "malloc_trim", "rss_mib", "trim_freed_memory"]

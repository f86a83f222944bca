"""SectionWriter: the leader's writes of store sections (controller.core.pending_writes).

Each section is one store value, written with compare-and-set against the revision this
leader last saw; a refused write means another controller leads now. Writes happen one
at a time (a lock), and the callers of `write_shared` in one pass of the event loop share
one write: N coordinators' commit reports that arrive together cost one write of the replicas
section, not N (each write encodes every replica). Failures count towards stepping down
(`WriteStreak`); sections not written come back in `SectionsUnwritten` for the core to mark
again (`WriteFailed`).
"""

from __future__ import annotations

import asyncio
import logging

from controller.core.sizes import encode_section, fit_journal, value_limit
from controller.core.store_health import WriteStreak
from controller.core.pending_writes import JOURNAL, write_order
from controller.service.errors import NotLeader
from controller.store import StoreError

log = logging.getLogger("fthsdp.controller")


class SectionsUnwritten(StoreError):
    """A write failed; `unwritten` are the sections it did not write (in order)."""

    def __init__(self, message: str, unwritten: tuple[str, ...]) -> None:
        super().__init__(message)
        self.unwritten = unwritten


class SectionWriter:
    def __init__(self, server) -> None:
        self.server = server
        #: section -> the revision this leader's next write must match (None: unknown, look)
        self.revisions: dict[str, int | None] = {}
        self.streak = WriteStreak()
        self._lock = asyncio.Lock()
        #: the shared write the callers of write_shared in this pass of the loop wait for,
        #: and the sections it holds
        self._batch: asyncio.Future | None = None
        self._batch_sections: dict[str, None] = {}
        self._tasks: set[asyncio.Task] = set()

    def start_leading(self, revisions: dict[str, int | None]) -> None:
        self.revisions, self.streak = dict(revisions), WriteStreak()

    @property
    def busy(self) -> bool:
        """A write is under way (an answer that follows from its change waits for it)."""
        return self._lock.locked()

    @property
    def batch_open(self) -> bool:
        """A shared write of this pass of the loop is gathering its callers."""
        return self._batch is not None

    async def write(self, sections) -> None:
        """Write `sections` in order (none: wait for a write under way, if any)."""
        state = self.server.require_leader()
        sections = tuple(sections)
        async with self._lock:
            for i, section in enumerate(sections):
                try:
                    await self._write_one(section, state.snapshot_section(section))
                except StoreError as exc:
                    self.revisions[section] = None
                    self._count_failure(f"{section}: {exc}")
                    raise SectionsUnwritten(str(exc), sections[i:]) from exc

    async def _write_one(self, section: str, snapshot) -> None:
        server = self.server
        value = self._encode(section, snapshot)
        expected = self.revisions.get(section, 0)
        if expected is None:  # an earlier write's outcome is unknown: look
            expected = (await server.store.get(server.key(section))).revision
        revision = await server.store.cas(server.key(section), value, expected, server.leadership)
        self.streak.succeeded()
        if revision is None:
            server.campaign.deposed(f"the store refused a write to {section}")
            raise NotLeader(f"controller {server.candidate} was deposed; its write was refused")
        self.revisions[section] = revision

    def _count_failure(self, what: str) -> None:
        s, clock = self.server.settings, self.server.clock
        self.streak.failed(what, clock())
        why = self.streak.step_down_reason(clock(), max_failures=s.store_failed_writes_to_step_down,
                                           max_failing_s=s.store_failing_s_to_step_down)
        if why:
            self.server.campaign.abdicate(why)

    async def write_shared(self, sections) -> None:
        """`write(sections)`, one for all its callers in the same pass of the event loop. A
        caller returns once a write that began after its change has ended, or raises what that
        write raised."""
        batch = self._batch
        if batch is None:
            batch = self._batch = asyncio.get_running_loop().create_future()
            batch.add_done_callback(_retrieved)
            task = asyncio.ensure_future(self._write_batch(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._batch_sections.update(dict.fromkeys(sections))
        await asyncio.shield(batch)

    async def _write_batch(self, batch: asyncio.Future) -> None:
        sections, self._batch_sections, self._batch = tuple(self._batch_sections), {}, None
        try:
            await self.write(write_order(sections))
        except asyncio.CancelledError:  # the server is stopping
            batch.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every caller hears it, as from its own write
            batch.set_exception(exc)
            return
        batch.set_result(None)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _encode(self, section: str, snapshot: dict | bytes) -> bytes:
        """A section's bytes, checked against what one store write may hold. The journal
        (display only) loses its oldest entries instead; any other section that does not fit
        is a bug in the up-front checks (controller.core.sizes): it is not sent, and counts
        as a failed write."""
        limit = value_limit(self.server.settings)
        if section == JOURNAL:
            snapshot, dropped = fit_journal(snapshot, limit)
            if dropped:
                log.warning("the journal is over the store's limit: %d oldest entries left out of its durable copy",
                            dropped)
        value = snapshot if isinstance(snapshot, bytes) else encode_section(snapshot)
        if len(value) > limit:
            raise StoreError(f"section {section} is {len(value)} bytes, more than the {limit} a store write may "
                             f"hold; not written")
        return value


def _retrieved(batch: asyncio.Future) -> None:
    """A batch whose callers were all cancelled is not reported as an exception never retrieved."""
    if not batch.cancelled():
        batch.exception()

"""The supervisor loop: observe each slot, ask `policy.next_action`, execute the answer.

The supervisor owns the slots and their processes; it knows nothing of gRPC. What a slot
wants is set from outside (`set_wants`, by the order handler); exits of trainers are handed
to `report` (non-blocking; the controller link sends them). `reconcile()` runs passes until
every slot waits, so an order's ack can follow its execution.

With warm restarts a training slot also holds a reserve standby (`policy.reserve_action`): a
pre-started process with exactly a standby's environment (`agent.env`), handed the slot's
placement on stdin when its trainer must be replaced, only after the old trainer was stopped
(SIGTERM, SIGKILL after stop_grace_s: its ports are free by then). The trainers one pass
must stop are stopped together, so a hung rank is not stopped only after its replica-mates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Callable

from agent import env as trainer_env
from agent.policy import (Action, ActionKind, Observed, Placement, Proc, RestartBudget, Role, Spec,
                          Want, is_finishing, next_action, reserve_action)
from agent.process import ExitStatus, Handle, Launch, ProcessHooks
from agent.settings import AgentSettings, substitute

log = logging.getLogger(__name__)

_MAX_PASSES = 4


@dataclass(frozen=True)
class TrainerExit:
    """One trainer exit, for the controller (ReportTrainerExit)."""

    replica_id: str
    rank: int
    exit_code: int      # -1 when killed by a signal
    signal: int         # 0 when it exited on its own
    stderr_tail: str
    version: int = 0    # the assignment version the trainer was started under


@dataclass
class Slot:
    index: int
    want: Want = field(default_factory=lambda: Want(Role.IDLE))
    handle: Handle | None = None
    proc: Proc | None = None          # what `handle` runs
    restart_times_s: list[float] = field(default_factory=list)
    halted_generation: int | None = None
    exit_tail: str = ""               # stderr tail of the exited process
    reserve: Handle | None = None     # the reserve standby (warm restarts)
    reserve_proc: Proc | None = None  # what `reserve` runs
    reserve_restart_times_s: list[float] = field(default_factory=list)


class Supervisor:
    def __init__(self, settings: AgentSettings, hooks: ProcessHooks,
                 report: Callable[[TrainerExit], None], clock: Callable[[], float],
                 base_env: dict[str, str]) -> None:
        self.settings = settings
        self._hooks = hooks
        self._report = report
        self._clock = clock
        self._base_env = base_env
        self._budget = RestartBudget(settings.restart_budget, settings.restart_window_s)
        self.slots = [Slot(i) for i in range(settings.slot_count)]
        #: trainers get it as FTHSDP_JOB_ID: the settings' job, else the controller's (once known)
        self.job_id = settings.job_id
        self._lock = asyncio.Lock()
        self.wake = asyncio.Event()
        #: where trainers keep their telemetry rings (set by the agent before it supervises)
        self.telemetry_dir: str | None = None
        #: once the job COMPLETED: until when its trainers may finish on their own (`finish`)
        self.finish_by_s: float | None = None

    def telemetry_file(self, slot_index: int) -> str:
        """The ring file of a slot ('' when telemetry is off)."""
        return os.path.join(self.telemetry_dir, f"slot-{slot_index}.ring") if self.telemetry_dir else ""

    def training(self) -> list[tuple[int, str, int]]:
        """(slot, replica_id, rank) of every trainer running now."""
        return [(slot.index, slot.proc.placement.replica_id, slot.proc.placement.rank) for slot in self.slots
                if slot.proc is not None and slot.proc.role is Role.TRAIN and slot.proc.placement is not None
                and not slot.proc.exited]

    # ------------------------------------------------------------------ wants

    def set_wants(self, wants: list[Want]) -> None:
        """New wants, one per slot (missing ones are IDLE); a changed want bumps generation.
        A want that differs only in its version (the controller confirmed what runs under a
        newer one) keeps its generation, and its running trainer counts as of that version."""
        wants = wants + [Want(Role.IDLE)] * (len(self.slots) - len(wants))
        for slot, want in zip(self.slots, wants):
            if replace(want, generation=0, version=0) != replace(slot.want, generation=0, version=0):
                slot.want = replace(want, generation=slot.want.generation + 1)
            elif want.version != slot.want.version:
                slot.want = replace(slot.want, version=want.version)
                if slot.proc is not None and slot.proc.generation == slot.want.generation:
                    slot.proc = replace(slot.proc, version=want.version)
        self.wake.set()

    def finish(self, grace_s: float) -> None:
        """The job COMPLETED: nothing more starts; a trainer still running finishes its own work
        (after Manager.close()) and is stopped only if it has not exited within `grace_s`."""
        if self.finish_by_s is None:
            self.finish_by_s = self._clock() + grace_s
        self.set_wants([])

    def finishing(self) -> list[Slot]:
        """The slots whose trainer runs on after the job COMPLETED (within the finish grace)."""
        return [slot for slot in self.slots if is_finishing(slot.proc, self._spec(slot))]

    async def finished(self) -> None:
        """Return once no trainer is finishing: each exited on its own, or was stopped once the
        grace had passed (the run loop's passes do that; bounded by the grace plus a stop)."""
        while True:
            await self.reconcile()
            if not self.finishing():
                return
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.settings.poll_interval_s)

    def resume(self) -> None:
        """Halted slots (gave up, finished, failed to start) may start again."""
        for slot in self.slots:
            slot.halted_generation = None
        self.wake.set()

    def bump(self) -> None:
        """A new generation for every non-idle slot: running trainers restart, halts clear."""
        for slot in self.slots:
            if slot.want.role is not Role.IDLE:
                slot.want = replace(slot.want, generation=slot.want.generation + 1)
        self.wake.set()

    # ------------------------------------------------------------------ loop

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile whenever a trainer exits or wants change, and every poll interval."""
        while not stop.is_set():
            self.wake.clear()
            await self.reconcile()
            try:
                await asyncio.wait_for(self.wake.wait(), self.settings.poll_interval_s)
            except asyncio.TimeoutError:
                pass

    async def reconcile(self) -> list[str]:
        """Passes until every slot waits (bounded). Returns errors from starting processes."""
        errors: list[str] = []
        async with self._lock:
            for _ in range(_MAX_PASSES):
                busy = await self._stop_together()
                for slot in self.slots:
                    action = self._decide(slot)
                    if action.kind is not ActionKind.WAIT or slot.proc and slot.proc.exited:
                        busy = True
                        error = await self._execute(slot, action)
                        if error:
                            errors.append(error)
                    action = self._decide_reserve(slot)
                    if action.kind is not ActionKind.WAIT or slot.reserve_proc and slot.reserve_proc.exited:
                        busy = True
                        await self._execute_reserve(slot, action)
                if not busy:
                    break
        return errors

    async def shutdown(self) -> None:
        """Stop every process (agent exit)."""
        async with self._lock:
            for slot in self.slots:
                slot.want = replace(Want(Role.IDLE), generation=slot.want.generation + 1)
            await asyncio.gather(*(self._stop(slot, "agent is shutting down")
                                   for slot in self.slots if slot.handle is not None),
                                 *(self._stop_reserve(slot, "agent is shutting down")
                                   for slot in self.slots if slot.reserve is not None))

    # ------------------------------------------------------------------ internals

    async def _stop_together(self) -> bool:
        """Stop at once every running trainer whose slot must stop (a STOP order, a halted
        replica): one after the other, a hung rank behind its replica-mates would get its
        signals only once they exited, and its peers in other replicas wait on its sockets."""
        stopping = [(slot, action) for slot in self.slots
                    if (action := self._decide(slot)).kind is ActionKind.STOP and not (slot.proc and slot.proc.exited)]
        await asyncio.gather(*(self._stop(slot, action.reason) for slot, action in stopping))
        return bool(stopping)

    def _decide(self, slot: Slot) -> Action:
        slot.proc, tail = self._poll(slot.handle, slot.proc)
        if tail is not None:
            slot.exit_tail = tail
        slot.reserve_proc, _ = self._poll(slot.reserve, slot.reserve_proc)  # a dead reserve is not swapped in
        return next_action(self._observe(slot), self._spec(slot))

    def _decide_reserve(self, slot: Slot) -> Action:
        slot.reserve_proc, _ = self._poll(slot.reserve, slot.reserve_proc)
        return reserve_action(self._observe(slot), self._spec(slot))

    def _poll(self, handle: Handle | None, proc: Proc | None) -> tuple[Proc | None, str | None]:
        """`proc` as it is now, and its stderr tail if it has just been seen to exit."""
        if handle is None or proc is None or proc.exited:
            return proc, None
        status = self._hooks.poll(handle)
        if status is None:
            return proc, None
        return replace(proc, exited=True, exit_code=status.exit_code, signal=status.signal), status.stderr_tail

    def _observe(self, slot: Slot) -> Observed:
        return Observed(now_s=self._clock(), proc=slot.proc, restart_times_s=tuple(slot.restart_times_s),
                        halted_generation=slot.halted_generation, reserve=slot.reserve_proc,
                        reserve_restart_times_s=tuple(slot.reserve_restart_times_s))

    def _spec(self, slot: Slot) -> Spec:
        return Spec(slot.want, self._budget, warm_restarts=self.settings.warm_restarts,
                    reserve_delay_s=self.settings.reserve_delay_s, finish_by_s=self.finish_by_s)

    async def _execute_reserve(self, slot: Slot, action: Action) -> None:
        tag = f"slot {slot.index} reserve"
        if slot.reserve_proc is not None and slot.reserve_proc.exited:
            slot.reserve, slot.reserve_proc = None, None
            log.log(logging.WARNING if action.kind is not ActionKind.WAIT else logging.INFO, "%s: %s", tag,
                    action.reason)
            if action.kind is ActionKind.RESTART:
                slot.reserve_restart_times_s.append(self._clock())
                await self._start_reserve(slot)
            return
        if action.kind is ActionKind.STOP:
            await self._stop_reserve(slot, action.reason)
        elif action.kind is ActionKind.START:
            log.info("%s: %s", tag, action.reason)
            await self._start_reserve(slot)

    async def _execute(self, slot: Slot, action: Action) -> str | None:
        tag = f"slot {slot.index}"
        if slot.proc is not None and slot.proc.exited:
            proc, tail = slot.proc, slot.exit_tail
            slot.handle, slot.proc = None, None
            clean = proc.exit_code == 0 and not proc.signal  # a finish, not a failure
            log.log(logging.INFO if clean else logging.WARNING, "%s: %s", self._who(proc, tag),
                    action.reason)
            if proc.role is Role.TRAIN and proc.placement is not None:
                self._report(TrainerExit(
                    replica_id=proc.placement.replica_id, rank=proc.placement.rank,
                    exit_code=-1 if proc.exit_code is None else proc.exit_code,
                    signal=proc.signal or 0, stderr_tail=tail, version=proc.version))
            if action.kind is ActionKind.RESTART:
                slot.restart_times_s.append(self._clock())
                return await self._start(slot)
            if action.kind is ActionKind.HALT_REPLICA:
                self._halt_replica(proc)
            if action.kind is ActionKind.GIVE_UP or proc.generation == slot.want.generation:
                slot.halted_generation = slot.want.generation  # gave up, finished or halted
            return None
        if action.kind is ActionKind.STOP:
            await self._stop(slot, action.reason)
        elif action.kind is ActionKind.START:
            log.info("%s: %s", tag, action.reason)
            return await self._start(slot)
        elif action.kind is ActionKind.SWAP_IN:
            return await self._swap_in(slot, action.reason)
        return None

    def _halt_replica(self, dead: Proc) -> None:
        """A trainer died: every slot of its replica halts at its generation (running ones are
        stopped on the next pass) until an order, normally the replica's RESTART, moves it on."""
        for slot in self.slots:
            p = slot.want.placement
            if slot.want.role is Role.TRAIN and p is not None and p.replica_id == dead.placement.replica_id:
                slot.halted_generation = slot.want.generation

    def _launch(self, slot: Slot, p: Placement | None, label: str) -> Launch:
        """What one process of the slot is started with: a trainer for `p`, or a standby (None;
        a spare's standby and a reserve alike)."""
        s = self.settings
        values = {"replica_id": p.replica_id if p else "", "rank": p.rank if p else -1,
                  "world_size": p.world_size if p else 0, "host_id": s.host_id, "job_id": self.job_id,
                  "slot": slot.index}
        return Launch(
            argv=substitute(s.command, values),
            env=trainer_env.trainer_environment(self._base_env, p, host_id=s.host_id, job_id=self.job_id,
                                                controller=",".join(s.controller_addresses), tls=s.tls,
                                                secret=s.job_secret, insecure_trainer_ports=s.insecure_trainer_ports,
                                                telemetry_file=self.telemetry_file(slot.index),
                                                replica_version=slot.want.version if p else 0,
                                                slot=slot.index),
            standby=p is None,
            label=f"{s.host_id} {p.replica_id}/{p.rank}" if p else f"{s.host_id} {label}{slot.index}")

    def _forget_ring(self, slot: Slot) -> None:
        """The last trainer's ring must not be read as the next one's."""
        ring = self.telemetry_file(slot.index)
        if ring:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ring)

    async def _start(self, slot: Slot) -> str | None:
        want = slot.want
        p = want.placement if want.role is Role.TRAIN else None
        launch = self._launch(slot, p, "standby")
        try:
            self._forget_ring(slot)
            slot.handle = await self._hooks.start(launch)
        except OSError as exc:
            slot.halted_generation = want.generation
            error = f"cannot start {launch.argv[0]!r} on slot {slot.index}: {exc}"
            log.error("%s", error)
            return error
        slot.proc = Proc(want.role, want.generation, p, want.version, started_s=self._clock())
        log.info("%s: started pid %d", self._who(slot.proc, f"slot {slot.index}"),
                 slot.handle.pid)
        return None

    async def _start_reserve(self, slot: Slot) -> None:
        """A reserve that cannot start is logged, not an order's error: restarts are cold then."""
        launch = self._launch(slot, None, "reserve")
        try:
            slot.reserve = await self._hooks.start(launch)
        except OSError as exc:
            slot.reserve_restart_times_s.append(self._clock())  # counts against the budget: no hot loop
            log.error("slot %d: cannot start a reserve %r: %s", slot.index, launch.argv[0], exc)
            return
        slot.reserve_proc = Proc(Role.STANDBY, slot.want.generation)
        log.info("slot %d reserve: started pid %d", slot.index, slot.reserve.pid)

    async def _stop_reserve(self, slot: Slot, reason: str) -> None:
        if slot.reserve is None:
            return
        log.info("slot %d reserve: stopping pid %d: %s", slot.index, slot.reserve.pid, reason)
        await self._hooks.stop(slot.reserve, self.settings.stop_grace_s)
        slot.reserve, slot.reserve_proc = None, None

    async def _stop(self, slot: Slot, reason: str) -> ExitStatus | None:
        if slot.handle is None or slot.proc is None:
            return None
        log.info("%s: stopping pid %d: %s", self._who(slot.proc, f"slot {slot.index}"),
                 slot.handle.pid, reason)
        status = await self._hooks.stop(slot.handle, self.settings.stop_grace_s)
        slot.handle, slot.proc = None, None
        return status

    async def _swap_in(self, slot: Slot, reason: str) -> str | None:
        if slot.handle is None:  # the slot is empty: its reserve takes the placement
            assert slot.reserve is not None and slot.reserve_proc is not None
            slot.handle, slot.proc = slot.reserve, slot.reserve_proc
            slot.reserve, slot.reserve_proc = None, None
            self._forget_ring(slot)  # the old trainer's, stopped by now; the reserve makes its own
        assert slot.handle is not None and slot.proc is not None
        want, s = slot.want, self.settings
        line = trainer_env.handover_line(want.placement, host_id=s.host_id, job_id=self.job_id,
                                         controller=",".join(s.controller_addresses), replica_version=want.version)
        try:
            await self._hooks.hand_over(slot.handle, line)
        except (OSError, RuntimeError) as exc:
            # The standby died under us: stop what is left; the next pass cold-starts.
            log.warning("slot %d: hand-over to pid %d failed (%s); starting cold",
                        slot.index, slot.handle.pid, exc)
            await self._stop(slot, "hand-over failed")
            return None
        slot.proc = Proc(Role.TRAIN, want.generation, want.placement, want.version, started_s=self._clock())
        log.info("%s: %s (pid %d)", self._who(slot.proc, f"slot {slot.index}"), reason,
                 slot.handle.pid)
        return None

    def _who(self, proc: Proc, default: str) -> str:
        if proc.role is Role.TRAIN:
            return str(proc.placement)
        return f"{default} {proc.role.value}"

"""Fault injection for the runtime's tests: wrappers around real parts, applied from outside
(through `fthsdp.Seams`, or by pointing a fetcher at a proxy). Production code never
checks for a fault.

    seams = Seams(endpoint=lambda ep: KillWhenAllreduceStarts(ep, lambda: manager.plan.step == 4),
                  sync=lambda s: FailingSync(s, lambda plan: "injected" if plan and plan.step == 7 else None))
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
from pathlib import Path
from typing import Callable

from fthsdp.demo.faults import Delegate
from fthsdp.state.checkpoint import CheckpointStore
from fthsdp.sync.gradients import GradientSync, SyncResult


class KillWhenAllreduceStarts(Delegate):
    """An FTAR endpoint whose process exits (as if SIGKILLed: no cleanup, code 137; or by a
    real signal, when `kill` sends it) right after an all-reduce was submitted, when
    `should_kill()` says so. With FSDP2 that is in the middle of backward: the first group's
    shard is on its way, the other groups' gradients are not computed yet."""

    def __init__(self, endpoint, should_kill: Callable[[], bool], before_exit: Callable[[], None] = lambda: None,
                 kill: Callable[[], None] | None = None):
        super().__init__(endpoint)
        self._should_kill, self._before_exit, self._kill = should_kill, before_exit, kill

    def allreduce(self, tensor):
        if not self._should_kill():
            return self._inner.allreduce(tensor)
        # Recorded before the submit: from the submit to the exit this thread keeps the GIL, so
        # FTAR's runner thread, which sends and receives a small all-reduce on its own, cannot
        # finish it in between (with the record's write after the submit it sometimes did, and
        # the peers' all-reduce succeeded: nothing to retry).
        self._before_exit()
        self._inner.allreduce(tensor)
        if self._kill is not None:
            self._kill()
        os._exit(137)


class HoldWhenAllreduceStarts(Delegate):
    """An FTAR endpoint that, when `should_hold()` says so as an all-reduce is about to be
    submitted (it is asked at every one: let it say yes once), first calls `hold()`, which
    returns when the test lets the rank go on: the rank sits inside a step (or sync) whose
    quorum was answered, before any byte of its all-reduce left and before anything was
    committed."""

    def __init__(self, endpoint, should_hold: Callable[[], bool], hold: Callable[[], None]) -> None:
        super().__init__(endpoint)
        self._should_hold, self._hold = should_hold, hold

    def allreduce(self, tensor):
        if self._should_hold():
            self._hold()
        return self._inner.allreduce(tensor)


class HoldBeforeQuorum(Delegate):
    """A coordinator's controller client that, when `should_hold(step)` says so, calls
    `hold(step)` before it sends the replica's join for that step: the replica has not joined
    the round yet while the others have (and wait for it at the controller)."""

    def __init__(self, controller, should_hold: Callable[[int], bool], hold: Callable[[int], None]) -> None:
        super().__init__(controller)
        self._should_hold, self._hold = should_hold, hold

    def quorum(self, request, *args, **kwargs):
        if self._should_hold(request.step):
            self._hold(request.step)
        return self._inner.quorum(request, *args, **kwargs)


class FailingSync(Delegate):
    """A GradientSync whose reduction really runs (other replicas include this rank's
    gradient) but reports failure when `reason_for(plan)` returns a reason: this rank votes no."""

    def __init__(self, sync: GradientSync, reason_for: Callable[[object], str | None]) -> None:
        super().__init__(sync)
        self._reason_for = reason_for

    def reduce_(self, flat, plan, in_replica: bool = True) -> SyncResult:
        result = self._inner.reduce_(flat, plan, in_replica)
        reason = self._reason_for(plan)
        return SyncResult(False, reason) if reason else result

    def wait_shards(self, plan) -> SyncResult:
        result = self._inner.wait_shards(plan)
        reason = self._reason_for(plan)
        return SyncResult(False, reason) if reason else result


class HiddenAtStart(Delegate):
    """A checkpoint store whose first `latest_complete()` (the Manager's look at start) finds
    nothing, as if the process had started before any checkpoint was written; later loads
    (a resume a rollback quorum offers) see the real store."""

    def __init__(self, store: CheckpointStore) -> None:
        super().__init__(store)
        self._hidden = True

    def latest_complete(self):
        if self._hidden:
            self._hidden = False
            return None
        return self._inner.latest_complete()


class SimulatedCrash(Exception):
    """Raised where a CrashingStore dies, as if the process died there."""


class CrashingStore(CheckpointStore):
    """A checkpoint store that dies before its `crash_before`-th file becomes visible
    (1: before the side file's rename; 2: before the marker's; 3: before the folder's)."""

    def __init__(self, directory: str | os.PathLike[str], crash_before: int) -> None:
        super().__init__(directory)
        self._left = crash_before

    def _publish(self, tmp: Path, final: Path) -> None:
        self._left -= 1
        if self._left == 0:
            raise SimulatedCrash(f"simulated crash before {final.name} became visible")
        super()._publish(tmp, final)


class DamagingProxy:
    """A TCP proxy in front of `target` that damages the next connection's response:
    "corrupt" flips one byte past `after_bytes`, "truncate" closes it there. Later
    connections pass through untouched."""

    def __init__(self, target: str, damage: str, after_bytes: int = 4096) -> None:
        if damage not in ("corrupt", "truncate"):
            raise ValueError(f"damage must be 'corrupt' or 'truncate', got {damage!r}")
        self._target, self._damage, self._after = target, damage, after_bytes
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            damage = self._damage if self.connections == 0 else ""
            self.connections += 1
            threading.Thread(target=self._pipe, args=(client, damage), daemon=True).start()

    def _pipe(self, client: socket.socket, damage: str) -> None:
        host, _, port = self._target.rpartition(":")
        upstream = socket.create_connection((host, int(port)), timeout=10)
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, client)
        sent_back = 0
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(1.0):
                    data = key.fileobj.recv(1 << 16)
                    if not data:
                        return
                    if key.fileobj is upstream and damage and sent_back + len(data) > self._after:
                        cut = max(self._after - sent_back, 0)
                        if damage == "truncate":
                            client.sendall(data[:cut])
                            return
                        data = data[:cut] + bytes([data[cut] ^ 0xFF]) + data[cut + 1:]
                        damage = ""
                    if key.fileobj is upstream:
                        sent_back += len(data)
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            client.close()
            upstream.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(5.0)

"""Trainer processes: start, poll, stop, hand over (the supervisor's hooks), on asyncio.

Each trainer runs in its own session, so it and its children form one process group: a stop
signals the whole group (SIGTERM, and SIGCONT so that a stopped process acts on it, then
SIGKILL after a grace period, bounded). On Linux a trainer is also SIGKILLed by the kernel
when its agent dies (see `_with_pdeathsig`). Its stderr is copied to the agent's stderr line
by line with a `[host replica/rank]` prefix, and the last lines are kept for the exit report.
A standby's stdin is a pipe that carries the hand-over.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from typing import Callable, Protocol

log = logging.getLogger(__name__)

# After SIGKILL, how long to wait for the kernel to reap the group leader.
_KILL_WAIT_S = 5.0
# After exit, how long to wait for the last stderr lines before reporting without them.
_TAIL_WAIT_S = 1.0
_PDEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('fthsdp agent: the agent died before its trainer started')\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n")


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str] = field(repr=False)  # holds the job secret: never shown
    standby: bool      # stdin is a pipe for the hand-over line
    label: str         # stderr prefix, e.g. "h1 r0/1"


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int | None   # None when killed by a signal
    signal: int | None      # None when it exited on its own
    stderr_tail: str


class Handle(Protocol):
    pid: int


class ProcessHooks(Protocol):
    """What the supervisor needs from processes. Tests may pass fakes."""

    async def start(self, launch: Launch) -> Handle: ...
    def poll(self, handle: Handle) -> ExitStatus | None: ...
    async def stop(self, handle: Handle, grace_s: float) -> ExitStatus: ...
    async def hand_over(self, handle: Handle, line: bytes) -> None: ...


class Trainer:
    """One started trainer process (a Handle)."""

    def __init__(self, proc: asyncio.subprocess.Process, label: str, tail_lines: int) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.label = label
        self.tail: collections.deque[str] = collections.deque(maxlen=max(tail_lines, 1))
        self.status: ExitStatus | None = None
        self.done = asyncio.Event()
        self.exited = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    def __init__(self, exited: asyncio.Event, **kw) -> None:
        super().__init__(**kw)
        self._exited = exited

    def process_exited(self) -> None:
        super().process_exited()
        self._exited.set()


class SubprocessHooks:
    """Real processes. `on_exit` is called (no arguments) whenever a trainer exits; by then
    the rest of its process group has been SIGKILLed."""

    def __init__(self, tail_lines: int = 20, on_exit: Callable[[], None] | None = None,
                 echo_stderr: bool = True) -> None:
        self._tail_lines = tail_lines
        self._on_exit = on_exit or (lambda: None)
        self._echo = echo_stderr

    async def start(self, launch: Launch) -> Trainer:
        # asyncio.create_subprocess_exec, with a protocol that tells the exit itself: on 3.11
        # Process.wait() also waits for the pipes, which a trainer's child may hold open.
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()
        transport, protocol = await loop.subprocess_exec(
            lambda: _Protocol(exited, limit=2 ** 16, loop=loop),
            *_with_pdeathsig(launch.argv),
            env=launch.env,
            stdin=asyncio.subprocess.PIPE if launch.standby else asyncio.subprocess.DEVNULL,
            stdout=None,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        trainer = Trainer(proc, launch.label, self._tail_lines)
        trainer.exited = exited
        trainer._reader = asyncio.create_task(self._read_stderr(trainer))
        trainer._watcher = asyncio.create_task(self._watch(trainer))
        return trainer

    def poll(self, handle: Handle) -> ExitStatus | None:
        assert isinstance(handle, Trainer)
        return handle.status

    async def stop(self, handle: Handle, grace_s: float) -> ExitStatus:
        assert isinstance(handle, Trainer)
        if handle.status is None:
            _signal_group(handle.pid, signal.SIGTERM)
            # A stopped process (SIGSTOP, a debugger) acts on nothing but SIGKILL until it is
            # continued: without this its SIGTERM would wait out the grace, and every peer
            # still connected to it (FTAR rings of other replicas) with it. Harmless otherwise.
            _signal_group(handle.pid, signal.SIGCONT)
            try:
                await asyncio.wait_for(handle.done.wait(), grace_s)
            except asyncio.TimeoutError:
                log.warning("[%s] trainer pid %d ignored SIGTERM for %.1f s; sending SIGKILL",
                            handle.label, handle.pid, grace_s)
        # Children of the trainer may outlive it: the group goes in every case.
        _signal_group(handle.pid, signal.SIGKILL)
        try:
            await asyncio.wait_for(handle.done.wait(), _KILL_WAIT_S)
        except asyncio.TimeoutError:
            log.error("[%s] trainer pid %d still not reaped %.0f s after SIGKILL",
                      handle.label, handle.pid, _KILL_WAIT_S)
        return handle.status or ExitStatus(None, signal.SIGKILL, "".join(handle.tail))

    async def hand_over(self, handle: Handle, line: bytes) -> None:
        assert isinstance(handle, Trainer)
        stdin = handle.proc.stdin
        if stdin is None:
            raise RuntimeError(f"trainer pid {handle.pid} is not a standby (no stdin pipe)")
        stdin.write(line)
        await stdin.drain()
        stdin.close()

    async def _read_stderr(self, trainer: Trainer) -> None:
        assert trainer.proc.stderr is not None
        prefix = f"[{trainer.label}] ".encode()
        while True:
            line = await trainer.proc.stderr.readline()
            if not line:
                return
            trainer.tail.append(line.decode(errors="replace"))
            if self._echo:
                sys.stderr.buffer.write(prefix + line)
                sys.stderr.buffer.flush()

    async def _watch(self, trainer: Trainer) -> None:
        await trainer.exited.wait()
        code = trainer.proc.returncode
        assert code is not None
        # What the trainer left in its group goes with it (and with it, open stderr pipes).
        _signal_group(trainer.pid, signal.SIGKILL)
        if trainer._reader is not None:
            try:
                await asyncio.wait_for(asyncio.shield(trainer._reader), _TAIL_WAIT_S)
            except asyncio.TimeoutError:
                pass  # something still holds stderr open; report what we have
        if code < 0:
            trainer.status = ExitStatus(None, -code, "".join(trainer.tail))
        else:
            trainer.status = ExitStatus(code, None, "".join(trainer.tail))
        trainer.done.set()
        self._on_exit()


def _with_pdeathsig(argv: list[str]) -> list[str]:
    """On Linux, run `argv` through a tiny exec wrapper that asks the kernel to SIGKILL it when
    the agent dies (PR_SET_PDEATHSIG survives exec), so a dead agent's trainer cannot keep
    running next to the spare that replaced it. A wrapper, not preexec_fn: Python code between
    fork and exec in a process with gRPC threads can deadlock or abort."""
    if not sys.platform.startswith("linux"):
        return argv
    if shutil.which(argv[0]) is None:  # report "cannot start" here, not as an exit code
        raise FileNotFoundError(f"no executable {argv[0]!r}")
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *argv]


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already

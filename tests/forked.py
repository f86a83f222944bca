"""Test workers forked from a process that imported torch once, instead of started from scratch.

    proc = forked.start("tests.runtime.train_worker", [json.dumps(cfg)], log=path, env=env, cwd=REPO)

A fresh Python that imports torch and FSDP2 spends about 5 s of CPU before it runs a line of the
worker; a cluster test starts six to ten of them at once on two cores. multiprocessing's fork
server imports `PRELOAD` once per test session and forks every worker from there, so a worker
starts in milliseconds, already past those imports — what an agent's warm standby does for a
real trainer. The workers are still real processes: their own pid, stdin and stdout pipes, a
log file as stderr, the environment and working directory they are given, killed with real
signals, and their exit code (negative: the signal) read back like `subprocess.Popen`'s.

The server imports the trainer runtime too (fthsdp's Manager and what it loads: gRPC, the
protos, the step protocol, the state server): about a sixth of a trainer's imports, which a
restarted replica's ranks would otherwise redo while the survivors wait for it.

Forking after these imports is safe: nothing in `PRELOAD` starts a thread that holds a lock a
child could need (numpy's BLAS pool re-forms after a fork), none reads the environment when
imported (each reads it when called: the child's, set before the worker runs), and gRPC is only
imported: its core starts with the first channel or server, which each worker makes after the
fork (a channel must never cross one).

Controllers too: `popen` is the `subprocess.Popen` that tests/conftest.py gives
controller/launch.py, and the server imports the controller's modules as well, so each of the
some 260 controllers a run starts skips about 0.9 s of CPU of imports.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

PRELOAD = ["numpy", "torch", "torch.distributed", "torch.distributed.device_mesh", "torch.distributed.fsdp",
           "torch.distributed.tensor", "torch.distributed.checkpoint", "torch.optim", "ftar_kernels",
           "grpc", "fthsdp.manager", "fthsdp.optimizer_wrapper", "fthsdp.state.checkpoint", "fthsdp.state.digest",
           "fthsdp.state.shards", "fthsdp.process_group",
           # the controller's start (tests' `launch`, through `popen` below)
           "controller.main", "controller.service.server", "controller.service.rest", "controller.etcd_store"]


def context() -> multiprocessing.context.ForkServerContext:
    """The fork server context; its server (one per test session) imports PRELOAD when it starts."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class Forked:
    """The part of `subprocess.Popen` the test harnesses use, for a worker forked by the server."""

    def __init__(self, process: multiprocessing.process.BaseProcess, args: list[str], stdin, stdout) -> None:
        self._process = process
        self.args = args
        self.pid = process.pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # exited meanwhile

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def close(self) -> None:
        for f in (self.stdin, self.stdout):
            if f is not None:
                f.close()


def start(module: str, argv: list[str], *, log: Path | None, env: dict[str, str], cwd: Path,
          pipes: bool = True, stdin: bool | None = None, stderr: int | None = None) -> Forked:
    """Run `python -m module *argv` as a forked worker; stderr (and stdout without `pipes`) to `log`.

    With `pipes` its stdin and stdout are pipes (`stdin=False`: stdin is /dev/null instead).
    `stderr`, a file descriptor, takes the place of `log` for stderr (without `log` and
    `stderr`: /dev/null)."""
    if not in_own_network_namespace():
        raise RuntimeError(f"forked.start({module!r}) from a thread in another network namespace: the fork server "
                           "lives in the process's own, and so would the worker; start it with subprocess instead")
    ctx = context()
    stdin = pipes if stdin is None else stdin
    stdin_r = stdin_w = stdout_r = stdout_w = None
    if stdin:
        stdin_r, stdin_w = os.pipe()
    if pipes:
        stdout_r, stdout_w = os.pipe()
    err = os.dup(stderr) if stderr is not None else None
    child_ends = [Connection(fd, readable=True, writable=True) if fd is not None else None
                  for fd in (stdin_r, stdout_w, err)]
    process = ctx.Process(target=_run, args=(module, list(argv), dict(env), str(cwd), str(log) if log else None,
                                             *child_ends), daemon=True, name=module)
    try:
        process.start()
    finally:
        for end in child_ends:
            if end is not None:
                end.close()
    return Forked(process, [sys.executable, "-m", module, *argv],
                  os.fdopen(stdin_w, "w", buffering=1) if stdin else None,
                  os.fdopen(stdout_r, "r") if pipes else None)


def popen(argv: list[str], *, stdout=None, stderr=None, stdin=None, text: bool = False, env=None, cwd=None):
    """`subprocess.Popen` for `launch` (controller/launch.py): `python -m module ...` with its
    stdout a pipe read as text runs forked from the server; anything else starts as usual.

    Each controller a test starts then skips the imports its start would repeat (about 0.9 s of
    CPU of its 1.2 s; some 260 starts a run). The server has torch imported, which a forked
    controller carries unused in its memory: a test of the controller's own memory starts it
    with `spawner=subprocess.Popen`.

    Started as usual instead: from a thread that entered another network namespace
    (tests/chaos/network.py: the child must live there, and the server lives in the process's
    own), and with an environment whose exec-time variables differ from ours (LD_PRELOAD for
    faketime's skewed clock, PYTHON*: only an exec reads them)."""
    forkable = (argv[:2] == [sys.executable, "-m"] and stdout == subprocess.PIPE and text
                and stdin in (None, subprocess.DEVNULL)
                and (stderr in (None, subprocess.DEVNULL) or hasattr(stderr, "fileno"))
                and in_own_network_namespace() and not _exec_time_changes(os.environ if env is None else env))
    if not forkable:
        return subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=stdin, text=text, env=env, cwd=cwd)
    if stderr is None:
        err = 2  # inherited, as Popen's default
    elif stderr == subprocess.DEVNULL:
        err = None
    else:
        stderr.flush()
        err = stderr.fileno()
    return start(argv[2], argv[3:], log=None, env=dict(os.environ if env is None else env), cwd=Path(cwd or os.getcwd()),
                 stdin=False, stderr=err)


def run(module: str, argv: list[str], *, log: Path, env: dict[str, str], cwd: Path,
        timeout_s: float) -> tuple[int, str]:
    """`subprocess.run` for a forked worker: `python -m module *argv` to its end (killed after
    `timeout_s`, which fails); its exit status and what it wrote (stderr and stdout, from `log`)."""
    proc = start(module, argv, log=log, env=env, cwd=cwd, pipes=False)
    try:
        code = proc.wait(timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, log.read_text()


def _network_namespace() -> int | None:
    try:
        return os.stat("/proc/thread-self/ns/net").st_ino
    except OSError:
        return None  # no such file: no namespaces to be in


#: the test process's network namespace, where its fork server lives: this module is imported
#: (by tests/conftest.py) before any test moves a thread elsewhere
_HOME = _network_namespace()


def in_own_network_namespace() -> bool:
    """Whether the calling thread is in the test process's network namespace: a thread that
    entered another (tests/chaos/network.py) starts its children there, and the fork server,
    started from such a thread, would serve every later test from there."""
    return _network_namespace() == _HOME


#: variables a process reads only when it is exec'd (the loader's, the interpreter's, faketime's)
_EXEC_TIME = ("LD_", "PYTHON", "FAKETIME")


def _exec_time_changes(env) -> bool:
    names = {k for k in (*env, *os.environ) if k.startswith(_EXEC_TIME)}
    return any(env.get(k) != os.environ.get(k) for k in names)


def _run(module: str, argv: list[str], env: dict[str, str], cwd: str, log: str | None,
         stdin: Connection | None, stdout: Connection | None, stderr: Connection | None) -> None:
    """In the forked child: become `python -m module *argv` with these streams, env and cwd."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if stderr is not None:
        fd = os.dup(stderr.fileno())
    elif log is not None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    else:
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)
    os.dup2(fd if stdout is None else stdout.fileno(), 1)
    if stdin is None:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    else:
        os.dup2(stdin.fileno(), 0)
    os.close(fd)
    for end in (stdin, stdout, stderr):
        if end is not None:
            end.close()
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams, for its lifetime
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    # The server marks its children daemonic (they end with the test session) and hands them its
    # start method; a trainer may still start processes of its own as a real one does (DataLoader
    # workers): inside, it is not daemonic and starts them the platform's default way.
    multiprocessing.current_process().daemon = False
    multiprocessing.set_start_method(None, force=True)
    sys.argv = [module, *argv]
    sys.path.insert(0, cwd)
    runpy.run_module(module, run_name="__main__", alter_sys=True)

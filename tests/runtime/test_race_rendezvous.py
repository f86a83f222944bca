"""Race 2 of issue 28: a warm spare's rank reaches the old rank 0's rendezvous store.

When a host is lost, the controller sends ASSIGN to the spare and RESTART to the replica's
surviving hosts at once, and the rendezvous port is fixed per host (MASTER_ADDR:MASTER_PORT is
the rank-0 host's pod IP and port). The spare's standby takes its rank at once and dials the
rank-0 host while the old rank 0 there is still stopping: it reaches the old incarnation's
store, which is reset when that rank exits. With torch's env:// rendezvous the new rank failed
there (the replica restarted again). Under a replica version (FTHSDP_REPLICA_VERSION, set by
the agent) fthsdp.process_group meets under that version's prefix and waits for the new rank
0's "ready" key, redialling a store that is reset or not the version's, within its timeout.

Real processes on loopback addresses, as the DaemonSets-on-loopback proof runs its hosts: the
old replica (version 3) meets on 127.0.0.3:P, its rank 1 is SIGKILLed (the lost host), the
spare's rank 1 (version 7) is started while the old rank 0 still runs and is seen connected to
it, then the old rank 0 is stopped (SIGTERM, as the agent does) and the new rank 0 starts on
the same host and port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.runtime.cluster import PYTHON, REPO
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
RANK0_HOST = "127.0.0.3"
BOUND_S = 90  # torch imports on a loaded 2-core machine (a rank waits up to 150 s for its rank 0: its cold start)


def start(tmp_path: Path, name: str, rank: int, port: int, version: int, timeout_s: float = 150) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTHSDP_", "TORCHELASTIC_"))}
    env.update({"PYTHONPATH": str(REPO), "MASTER_ADDR": RANK0_HOST, "MASTER_PORT": str(port),
                "FTHSDP_REPLICA_VERSION": str(version)})
    err = open(tmp_path / f"{name}.err", "wb")
    try:
        return subprocess.Popen([PYTHON, __file__, str(rank), "2", str(timeout_s)], cwd=REPO, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
    finally:
        err.close()


def joined(proc: subprocess.Popen, what: str) -> dict:
    """The worker's one line once its group formed and summed (readline is bounded by the
    worker's own init timeout: it exits, closing stdout, when that passes)."""
    line = proc.stdout.readline()
    assert line, f"{what} exited ({proc.wait(10)}) without joining"
    return json.loads(line)


def connected_to(pid: int, port: int) -> bool:
    """`pid` holds an established TCP connection to `port` (its rendezvous store's); False
    once it is gone."""
    try:
        inodes = {os.readlink(fd)[8:-1] for fd in Path(f"/proc/{pid}/fd").iterdir()
                  if os.readlink(fd).startswith("socket:[")}
        rows = [row.split() for table in ("tcp", "tcp6")
                for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]]
    except OSError:
        return False
    # remote address, state (01: ESTABLISHED), inode; v4 clients may sit in tcp6 (mapped)
    return any(int(f[2].rsplit(":", 1)[1], 16) == port and f[3] == "01" and f[9] in inodes for f in rows)


def logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(tmp_path.glob("*.err")))


@pytest.mark.timeout(4 * BOUND_S)
def test_a_spare_that_reaches_the_old_rank_0s_store_meets_the_new_one(tmp_path):
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        # a first layout: each host's assignment got its own version as it registered, rank 0's first
        old0, old1 = start(tmp_path, "old0", 0, port, version=3), start(tmp_path, "old1", 1, port, version=4)
        procs += [old0, old1]
        first = [joined(old0, "old rank 0"), joined(old1, "old rank 1")]
        # rank 1 met under its rank 0's version, and its hello will carry it
        assert [(j["sum"], j["version"], j["env_version"]) for j in first] == [(3, 3, "3")] * 2, logs(tmp_path)
        old1.kill()  # the lost host
        old1.wait(10)

        spare = start(tmp_path, "spare1", 1, port, version=7)
        procs.append(spare)
        refused = "not this rank's: its rank 0 is of replica version 3, whose group formed already"
        wait_until(lambda: connected_to(spare.pid, port) or refused in (tmp_path / "spare1.err").read_text()
                   or spare.poll() is not None, BOUND_S, "the spare's rank 1 dialled the old rank 0's store")
        assert spare.poll() is None, logs(tmp_path)
        old0.send_signal(signal.SIGTERM)  # the RESTART's stop, while the spare is connected to it
        old0.wait(30)

        new0 = start(tmp_path, "new0", 0, port, version=7)
        procs.append(new0)
        second = [joined(new0, "new rank 0"), joined(spare, "the spare's rank 1")]
        assert [(j["sum"], j["version"]) for j in second] == [(3, 7)] * 2, logs(tmp_path)
        for p in (new0, spare):
            p.stdin.close()
            assert p.wait(30) == 0, logs(tmp_path)
        assert refused in (tmp_path / "spare1.err").read_text()  # it did reach the old store
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _worker(rank: int, world_size: int, timeout_s: float) -> int:
    """One rank: meet, sum rank + 1 over the group, print it, wait for stdin to close."""
    import logging
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from fthsdp.process_group import init_replica_group

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    version = init_replica_group("gloo", rank, world_size, timedelta(seconds=timeout_s))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(json.dumps({"rank": rank, "sum": int(t.item()), "version": version,
                      "env_version": os.environ["FTHSDP_REPLICA_VERSION"]}), flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))

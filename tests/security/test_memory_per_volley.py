"""Race 6 of issue 28: the controller's resident memory does not grow with the number of attack
volleys it refuses. A real controller process (holding the job secret, its legitimate h0 and
r0 served throughout) takes 20 volleys from a real client on loopback; each volley is
strangers' calls under names never seen before (so anything kept per caller, per claimed id or
per refusal would grow), bad credentials, undecodable bodies and oversized fields. The RSS
(/proc/<pid>/status) after 19 or 20 volleys (the lower) is within 10 % of the RSS after 2 (the first volleys
warm the allocator, gRPC's buffers and the caches up to their bounds). Both are read once the
RSS has settled (a refused volley's buffers are freed, and controller/freed_memory.py trims
what the allocator kept, within a second or two). Without the trim, the RSS after 20 volleys
was 15-17 % above the RSS after 2 with nothing alive in Python (tracemalloc): glibc's heaps kept
the freed pages. Under load it still missed one full run in three (84 against 70 MiB): a trim
in the middle of a volley raised the trimmer's base and the freed volley was never trimmed, and
glibc's dynamic thresholds kept up to 18 MiB at the top of gRPC threads' arenas, out of
malloc_trim's reach (both tested below)."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys

import grpc
import pytest

from controller.freed_memory import Trimmer
from protos import controller_pb2 as pb
from protos import credentials, job_secret

from .harness import HOST, HUGE, JOB, REPLICA, Legit, open_channel, proof, rss, settled_rss, start_controller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # 20 volleys of ~2,100 calls: past 120 s under heavy load
VOLLEYS, WARM = 20, 2
LATE = (VOLLEYS - 1, VOLLEYS)  # the settled RSS is read after each of these
NAMES = 300  # fresh claimed ids per kind of call, per volley
NOT_A_MESSAGE = b"\x0a\xff\xff"
OTHER = job_secret.parse(job_secret.generate(), "the stranger's guess")
_fresh = itertools.count()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _identity(data: bytes) -> bytes:
    return data


def _calls(stub, channel, legit: Legit, secret: str) -> list:
    """One volley: every call here is refused."""
    n = next(_fresh)
    ids = [f"x{n}-{i}-" + "n" * 40 for i in range(NAMES)]
    calls = []
    for i, name in enumerate(ids):
        calls += [
            # registrations: no proof, another secret's proof, a proof for another host
            stub.RegisterAgent(pb.RegisterAgentRequest(host_id=name, incarnation=name, spare=True), timeout=30),
            stub.RegisterAgent(pb.RegisterAgentRequest(host_id=name, incarnation=name, spare=True,
                                                       proof=proof(name, name, OTHER)), timeout=30),
            stub.RegisterAgent(pb.RegisterAgentRequest(host_id=name, incarnation="i", spare=True,
                                                       proof=proof(HOST, "i")), timeout=30),
            # a leader for r0 on a claimed host with a guessed token
            stub.ReportFailure(pb.ReportFailureRequest(
                job_id=JOB, replica_id=REPLICA, kind=pb.ReportFailureRequest.REPLICA_DEAD, reason="lies " + name,
                host_id=name, credential=credentials.host_credential(credentials.trainer_token(OTHER, name))),
                timeout=30),
            stub.Quorum(legit.quorum_request(host_id=name, incarnation=name,
                                             credential=credentials.host_credential("0" * 64)), timeout=30),
            # h0's agent calls with a wrong secret
            stub.AckOrder(pb.AckOrderRequest(host_id=HOST, order_id=name, ok=True, agent_secret=name), timeout=30),
            stub.ReportTrainerExit(pb.TrainerExitRequest(host_id=HOST, replica_id=REPLICA, rank=0, exit_code=1,
                                                         agent_secret=name), timeout=30),
        ]
        if i % 10 == 0:
            calls.append(channel.unary_unary("/fthsdp.v1.Controller/Quorum", request_serializer=_identity,
                                             response_deserializer=_identity)(NOT_A_MESSAGE, timeout=30))
    big = "x" * HUGE
    for field in ("host_id", "incarnation"):
        calls.append(stub.RegisterAgent(pb.RegisterAgentRequest(**{"host_id": "h9", "incarnation": "i", field: big}),
                                        timeout=30))
    calls.append(stub.ReportStep(legit.report(host_id="h" * (9 << 20)), timeout=30))
    return calls


async def _beats(stub, n: int) -> None:
    """Heartbeats for strangers' ids, on one stream: unknown ids are answered, never kept."""
    async def beats():
        for i in range(20):
            yield pb.HeartbeatRequest(host_ids=[f"b{n}-{i}-{k}" for k in range(100)],
                                      replica_ids=[f"q{n}-{i}-{k}" for k in range(100)])
    async for _ in stub.Heartbeat(beats(), timeout=30):
        pass


async def _volley(stub, channel, legit: Legit, secret: str, n: int) -> None:
    calls = _calls(stub, channel, legit, secret)
    results = await asyncio.gather(*calls, _beats(stub, n), return_exceptions=True)
    accepted = [r for r in results[:-1] if not isinstance(r, grpc.aio.AioRpcError)]
    assert not accepted, accepted[:3]
    assert not isinstance(results[-1], BaseException) or isinstance(results[-1], grpc.aio.AioRpcError), results[-1]


async def test_rss_after_20_volleys_is_within_10_percent_of_after_2():
    ctl = start_controller(spawner=subprocess.Popen)  # its own RSS, not a fork's of torch's pages
    channel = await open_channel(ctl.grpc)
    try:
        legit = Legit(pbg_stub(channel))
        await legit.register()
        await legit.step_once()
        samples, settled = [], {}
        for n in range(1, VOLLEYS + 1):
            await _volley(legit.stub, channel, legit, legit.secret, n)
            await legit.step_once()  # the legitimate parties are served between volleys
            samples.append(round(rss(ctl), 1))
            if n in (WARM, *LATE):
                settled[n] = await settled_rss(ctl)
        # What grows with the volleys is in every late reading; one reading that settled on a
        # heap the trimmer had not yet returned is not in the other. (The misses, 84 against 70
        # MiB in both late readings, were freed memory the trimmer never trimmed: see the test
        # below.)
        assert min(settled[n] for n in LATE) <= settled[WARM] * 1.10, (settled, samples)
        await legit.still_served(ctl.http)
    finally:
        await channel.close()
        ctl.stop()


def test_the_trimmer_trims_on_growth_at_most_once_an_interval():
    """controller/freed_memory.py's rule, on a fake clock: GROWTH_MIB above the base, at most
    every INTERVAL_S; a trim that gave much back keeps the base and is followed by another,
    one that gave little back raises it (that memory is alive)."""
    t = Trimmer(interval_s=1.0, growth_mib=8.0)
    assert not t.due(0.0, 100.0)  # the first reading only measures
    assert not t.due(5.0, 107.9)  # not grown enough
    assert t.due(5.0, 108.0)
    t.trimmed(5.0, 108.0, 106.0)  # little given back: alive, the new base
    assert t.base_mib == 106.0 and not t.due(6.0, 113.9) and t.due(6.0, 114.0)
    t.trimmed(6.0, 140.0, 120.0)  # mid-volley: much given back, the base stays
    assert t.base_mib == 106.0
    assert not t.due(6.5, 120.0)  # within the interval of the last trim
    assert t.due(7.0, 120.0)  # the volley's buffers freed: trimmed again
    t.trimmed(7.0, 120.0, 104.0)
    assert t.base_mib == 104.0  # the lowest seen
    assert t.due(8.0, 104.0)  # that one gave much back too: once more
    t.trimmed(8.0, 104.0, 103.5)
    assert t.base_mib == 103.5 and not t.due(60.0, 103.5)  # little: nothing more to give
    assert not t.due(61.0, 103.0) and t.base_mib == 103.0  # shrank a little by itself: the new base
    assert not t.due(62.0, 110.9) and t.due(62.0, 111.0)


def test_the_trimmer_trims_what_a_volley_freed_after_a_trim_found_it_alive():
    """Why the RSS test missed (84 against 70 MiB settled, one full run in three under load),
    from the controller's trim log over a loaded run: a trim in the middle of a volley gives little back (the
    volley's buffers are alive), so the base is raised to them; once they are freed the RSS
    falls by itself, and glibc keeps the rest of them in its heaps. That fall is a reason to
    trim, not a new base; and a trim that gave much back is followed by another until one
    gives little back, even below GROWTH_MIB above the base."""
    t = Trimmer(interval_s=1.0, growth_mib=4.0)
    t.due(0.0, 73.0)
    assert t.due(1.0, 97.4)
    t.trimmed(1.0, 97.4, 97.3)  # little given back, far above the base: doubted, tried again
    assert t.base_mib == 73.0 and t.due(2.0, 97.3)
    t.trimmed(2.0, 97.3, 97.2)  # alive mid-volley: the base is raised
    assert t.base_mib == 97.2
    assert t.due(3.0, 84.0)  # the volley is over and its buffers freed: trim them
    t.trimmed(3.0, 84.0, 74.0)
    assert t.base_mib == 74.0
    assert t.due(4.0, 76.0)  # 2 MiB above the base, but the last trim gave 10 back: follow it up
    t.trimmed(4.0, 76.0, 73.5)
    assert t.due(5.0, 73.5)  # 2.5 given back: once more
    t.trimmed(5.0, 73.5, 73.4)
    assert not t.due(6.0, 73.4) and not t.due(60.0, 75.0)  # little given back: quiet until grown or freed
    assert not t.due(61.0, 73.0)  # 2 MiB less: under GROWTH_MIB of a fall
    assert t.due(62.0, 70.9)  # 4.1 below the highest since the last trim: freed
    # A trim during a volley's last calls (seen after volley 20: 83.8 -> 82.8 on a base of 72),
    # which are freed a moment later with the RSS at 81.3: not believed alive until tried again.
    t.trimmed(62.0, 70.9, 70.9)
    assert t.due(63.0, 83.8)
    t.trimmed(63.0, 83.8, 82.8)
    assert t.base_mib == 70.9 and t.due(64.0, 81.3)


#: A fresh process (glibc's thresholds are the process's): a thread (a gRPC thread has its own
#: arena) allocates, touches and frees a 9 MiB block twice, as a controller refusing two 9 MiB
#: bodies does; prints how much more the RSS is once malloc_trim(0) has run.
_BIG_BLOCK_PROBE = """
import ctypes, sys, threading
from controller.freed_memory import fix_malloc_thresholds, malloc_trim, rss_mib
if sys.argv[1] == "fixed":
    assert fix_malloc_thresholds()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
N = 9 << 20
def body():  # a gRPC thread: its own arena
    for _ in range(2):  # the first raises glibc's thresholds; the second comes from the arena
        small = libc.malloc(64)  # the arena exists before the big block
        p = libc.malloc(N)
        ctypes.memset(p, 1, N)
        libc.free(p)
        libc.free(small)
t = threading.Thread(target=body); base = rss_mib(); t.start(); t.join()
malloc_trim()()
print(round(rss_mib() - base, 1))
"""


@pytest.mark.parametrize("thresholds, kept_mib", [("dynamic", (8.0, 10.0)), ("fixed", (-1.0, 1.0))])
def test_a_freed_big_block_leaves_a_threads_arena_once_the_thresholds_are_fixed(thresholds, kept_mib):
    """Why the late readings stayed ~8 MiB up even after trims that gave nothing more back: left
    dynamic, glibc raised its mmap threshold to the first freed 9 MiB block and its trim threshold
    to 18 MiB, so the second block came from the thread's arena and its top stayed resident;
    malloc_trim(0) does not trim a thread arena's top. controller/freed_memory.py fixes the
    thresholds (fix_malloc_thresholds) when the controller starts."""
    out = subprocess.run([sys.executable, "-c", _BIG_BLOCK_PROBE, thresholds], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    low, high = kept_mib
    assert low <= float(out.stdout) <= high, (thresholds, out.stdout)


def pbg_stub(channel):
    from protos import controller_pb2_grpc as pbg
    return pbg.ControllerStub(channel)

"""The quorum on one long-lived stream per leader, answers encoded once, and what a round
writes to the store: a real gRPC server in-process, a real client, a clock the test moves."""

import asyncio
import json

import grpc
import pytest

from controller.core.commands import CloseRound, ReportStep, Takeover, WriteFailed
from controller.service.server import ControllerServer
from controller.store import MemoryStore, StoreError
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg

from .conftest import quorum_request, wait_for

REPLICAS = ("r0", "r1", "r2")
WAIT_S = 10


class CountingStore(MemoryStore):
    """The in-memory store, counting writes per key; `fail` makes writes of keys ending so
    raise StoreError (an etcd that cannot be reached)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: dict[str, int] = {}
        self.fail = ""

    async def cas(self, key, value, expected_revision, leadership):
        if self.fail and key.endswith(self.fail):
            raise StoreError(f"store unreachable while writing {key}")
        section = key.split("/", 2)[2]
        self.writes[section] = self.writes.get(section, 0) + 1
        return await super().cas(key, value, expected_revision, leadership)


@pytest.fixture
async def counting(settings, clock):
    store = CountingStore()
    srv = ControllerServer(settings, clock=clock, store=store)
    await srv.start()
    await srv.wait_leading(10)
    yield srv, store
    await srv.stop()


class Leader:
    """One replica leader holding one QuorumStream open, as a real leader does."""

    def __init__(self, stub, rid: str) -> None:
        self.rid, self.call, self.known = rid, stub.QuorumStream(), 0

    async def ask(self, step: int, **kw) -> pb.QuorumResponse:
        await self.call.write(quorum_request(self.rid, step, known_quorum_id=self.known, **kw))
        reply = await asyncio.wait_for(self.call.read(), WAIT_S)
        assert reply is not grpc.aio.EOF, f"{self.rid}: the stream ended without an answer"
        self.known = reply.quorum_id
        return reply


async def stream_round(leaders, step: int) -> list[pb.QuorumResponse]:
    return list(await asyncio.gather(*(leader.ask(step) for leader in leaders)))


async def test_rounds_on_streams_share_one_encoded_answer_with_unary_callers(server, stub):
    leaders = [Leader(stub, rid) for rid in ("r0", "r1")]
    first = await asyncio.gather(stream_round(leaders, 0), stub.Quorum(quorum_request("r2", 0), timeout=WAIT_S))
    answers = first[0] + [first[1]]
    assert len({a.quorum_id for a in answers}) == 1 and all(a.addresses_included for a in answers)
    assert [m.replica_id for m in answers[0].members] == list(REPLICAS)
    assert list(answers[0].members[2].ftar_addresses) == ["r2-ftar-0:1", "r2-ftar-1:1"]
    # Everyone asked without the quorum id: everyone got the same bytes, encoded once.
    assert {a.SerializeToString() for a in answers} == {server.answers.encoded(0)}  # the unary one re-encoded
    qid = answers[0].quorum_id
    for step in (1, 2, 3):
        again = await asyncio.gather(stream_round(leaders, step),
                                     stub.Quorum(quorum_request("r2", step, known_quorum_id=qid), timeout=WAIT_S))
        replies = again[0] + [again[1]]
        assert {a.quorum_id for a in replies} == {qid} and {a.max_step for a in replies} == {step}
        assert not any(a.addresses_included for a in replies) and replies[0].reason.startswith("fast path")
        assert {a.SerializeToString() for a in replies} == {server.answers.encoded(qid)}


async def test_a_bad_request_ends_the_stream_with_its_code_and_changes_nothing(server, stub):
    call = stub.QuorumStream()
    await call.write(quorum_request("r0", -3))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(call.read(), WAIT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "step must not be negative, got -3" in err.value.details()
    assert server.state.replicas == {} and server.state.round_joined == {}
    # The leader opens a new stream and goes on.
    leaders = [Leader(stub, rid) for rid in REPLICAS]
    assert len({a.quorum_id for a in await stream_round(leaders, 0)}) == 1


async def test_a_stream_carries_one_replica(server, stub):
    leaders = [Leader(stub, rid) for rid in REPLICAS]
    await stream_round(leaders, 0)
    await leaders[0].call.write(quorum_request("r1", 1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(leaders[0].call.read(), WAIT_S)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "this stream carries replica 'r0'; a request for 'r1' needs its own stream" in err.value.details()
    assert server.state.round_joined == {}  # the stray request joined nobody


async def test_waiting_stream_leaders_hear_unavailable_when_the_controller_steps_down(server, stub):
    asked = asyncio.ensure_future(Leader(stub, "r0").ask(0))
    await wait_for(lambda: "r0" in server.state.round_joined, WAIT_S, "r0 to join the round")
    server.step_down("test: a standby took over")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(asked, WAIT_S)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "stepped down" in err.value.details()
    again = stub.QuorumStream()
    await again.write(quorum_request("r1", 0))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(again.read(), WAIT_S)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "standby" in err.value.details()


async def test_only_a_new_quorum_id_is_written_before_the_answer(counting):
    server, store = counting
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        stub = pbg.ControllerStub(channel)
        leaders = [Leader(stub, rid) for rid in REPLICAS]
        first = await stream_round(leaders, 0)
        assert store.writes.get("replicas", 0) >= 1  # the first quorum id: durable before anyone heard it
        qid = first[0].quorum_id

        def critical():  # what is written before answering (the journal is written behind, by the ticker)
            return {k: v for k, v in store.writes.items() if k == "replicas" or k.startswith("addresses/")}

        for step in range(1, 6):
            for rid in REPLICAS:  # each leader reports its commit (written) before its next join
                await stub.ReportStep(pb.ReportStepRequest(job_id="t", replica_id=rid, step=step - 1, quorum_id=qid,
                                                           step_time_s=0.1))
            before = critical()
            replies = await stream_round(leaders, step)
            assert {r.quorum_id for r in replies} == {qid}
            assert critical() == before, f"the fast-path round of step {step} wrote before answering"
        # A failed commit: the next quorum has a new id, written once before its answer.
        await stub.ReportFailure(pb.ReportFailureRequest(
            job_id="t", replica_id="r1", quorum_id=qid, step=5, kind=pb.ReportFailureRequest.COMMIT_FAILED,
            reason="FTAR timeout"))
        before = critical()
        replies = await stream_round(leaders, 5)
        assert {r.quorum_id for r in replies} == {qid + 1}
        assert critical()["replicas"] == before["replicas"] + 1


async def test_a_quorum_the_store_cannot_hold_is_refused_not_left_waiting(counting):
    server, store = counting
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        stub = pbg.ControllerStub(channel)
        store.fail = "/replicas"
        leaders = [Leader(stub, rid) for rid in REPLICAS]
        results = await asyncio.wait_for(
            asyncio.gather(*(leader.ask(0) for leader in leaders), return_exceptions=True), WAIT_S)
        assert all(isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.UNAVAILABLE
                   and "store unreachable" in r.details() for r in results), results
        # The store is back: the leaders join again on new streams and hear a durable quorum.
        store.fail = ""
        leaders = [Leader(stub, rid) for rid in REPLICAS]
        replies = await stream_round(leaders, 0)
        assert len({r.quorum_id for r in replies}) == 1
        assert (await store.get("jobs/t/replicas")).value  # what they act on is in the store


class HeldStore(CountingStore):
    """Once `held`, writes of the journal wait until the test lets them through (a slow etcd)."""

    def __init__(self) -> None:
        super().__init__()
        self.held = False
        self.writing, self.release = asyncio.Event(), asyncio.Event()

    async def cas(self, key, value, expected_revision, leadership):
        if self.held and key.endswith("/journal"):
            self.writing.set()
            await self.release.wait()
        return await super().cas(key, value, expected_revision, leadership)


async def test_a_fast_path_answer_waits_for_a_write_under_way(settings, clock):
    """Rounds that need no write are settled at once, without a task, but not past a write
    that another caller has started: the answer goes out after it ends."""
    store = HeldStore()
    server = ControllerServer(settings, clock=clock, store=store)
    await server.start()
    try:
        await server.wait_leading(10)
        async with grpc.aio.insecure_channel(server.grpc_address) as channel:
            stub = pbg.ControllerStub(channel)
            leaders = [Leader(stub, rid) for rid in REPLICAS]
            qid = (await stream_round(leaders, 0))[0].quorum_id
            for rid in REPLICAS:
                await stub.ReportStep(pb.ReportStepRequest(job_id="t", replica_id=rid, step=0, quorum_id=qid))
            # A warning dirties the journal (a second election of this controller: it is written
            # before anything else is answered), and the write holds.
            store.held = True
            server.submit(Takeover(server.candidate, 0.0))
            await asyncio.wait_for(store.writing.wait(), WAIT_S)
            pending = asyncio.ensure_future(stream_round(leaders, 1))
            done, _ = await asyncio.wait([pending], timeout=0.3)
            assert not done, "a fast-path round was answered while a store write was under way"
            store.release.set()
            replies = await asyncio.wait_for(pending, WAIT_S)
            assert {r.quorum_id for r in replies} == {qid} and replies[0].reason.startswith("fast path")
    finally:
        store.release.set()
        await server.stop()


async def test_commit_reports_of_one_pass_share_one_write_and_each_returns_after_it(counting):
    server, store = counting
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        leaders = [Leader(pbg.ControllerStub(channel), rid) for rid in REPLICAS]
        qid = (await stream_round(leaders, 0))[0].quorum_id
    state, before = server.state, store.writes["replicas"]

    async def report(rid: str) -> int:
        await server.apply(ReportStep(rid, 0, quorum_id=qid))
        stored = json.loads((await store.get("jobs/t/replicas")).value)
        return next(r["committed_step"] for r in stored["replicas"] if r["replica_id"] == rid)

    assert await asyncio.wait_for(asyncio.gather(*(report(rid) for rid in REPLICAS)), WAIT_S) == [0, 0, 0]
    assert store.writes["replicas"] == before + 1  # three reports, one write
    # A write that fails fails every caller that waited for it; none hears its change is durable.
    store.fail = "/replicas"

    async def close_with_a_change_to_write():
        # The change (as a failed write leaves it) is made and taken in one go: the ticker's own
        # Tick, between the two, would take it and its write fail for nobody here.
        server.step(WriteFailed(("replicas",)))
        return await server.apply(CloseRound())

    results = await asyncio.wait_for(asyncio.gather(
        close_with_a_change_to_write(), server.apply(CloseRound()), return_exceptions=True),
        WAIT_S)
    assert all(isinstance(r, StoreError) for r in results), results
    # Not stuck: the next write carries them.
    store.fail = ""
    await asyncio.wait_for(server.apply(CloseRound()), WAIT_S)
    # The ticker's Tick may have taken the change back first: then its write carries it, and this
    # CloseRound, with no change of its own, need not wait for it.
    await wait_for(lambda: store.writes["replicas"] >= before + 2, WAIT_S, "the write that carries the change")
    assert store.writes["replicas"] == before + 2  # one write, not one per caller

"""A leader's blocking QuorumStream against a real controller process: rounds on one stream,
refusals and silence as the unary call's errors, a new stream after each failure."""

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from fthsdp.step.quorum_stream import QuorumStream
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg

JOB = "qs"


@pytest.fixture
def controller(controller_process):
    return controller_process("--replicas", "2", "--min-replicas", "2", "--join-timeout-s", "30", "--job-id", JOB)


@pytest.fixture
def stubs(controller):
    channels = [grpc.insecure_channel(controller.grpc) for _ in range(2)]
    yield [pbg.ControllerStub(c) for c in channels]
    for c in channels:
        c.close()


def request(i: int, step: int, known: int = 0) -> pb.QuorumRequest:
    return pb.QuorumRequest(job_id=JOB, replica_id=f"r{i}", step=step, world_size=1, known_quorum_id=known,
                            ftar_addresses=[f"127.0.0.1:{29500 + i}"], state_addresses=[f"127.0.0.1:{29600 + i}"])


def test_rounds_go_on_one_stream_per_leader(stubs):
    streams = [QuorumStream(), QuorumStream()]
    known = [0, 0]
    with ThreadPoolExecutor(2) as pool:
        for step in range(4):
            answers = list(pool.map(lambda i: streams[i].ask(stubs[i], request(i, step, known[i]), 10), range(2)))
            assert len({a.quorum_id for a in answers}) == 1 and {a.max_step for a in answers} == {step}
            assert [a.addresses_included for a in answers] == [step == 0] * 2
            if step == 0:
                calls = [s._call for s in streams]
            known = [a.quorum_id for a in answers]
    assert [s._call for s in streams] == calls and all(s.open for s in streams)  # never reopened
    for s in streams:
        s.close()
    assert not any(s.open for s in streams)


def test_a_refusal_comes_out_with_its_code_and_the_next_ask_opens_a_new_stream(stubs):
    stream = QuorumStream()
    with pytest.raises(grpc.RpcError) as err:
        stream.ask(stubs[0], pb.QuorumRequest(job_id="someone-else", replica_id="r0", step=0, world_size=1), 10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "job_id 'someone-else'" in err.value.details()
    assert not stream.open
    other = QuorumStream()
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda i: (stream, other)[i].ask(stubs[i], request(i, 0), 10), range(2)))
    assert len({a.quorum_id for a in answers}) == 1
    stream.close()
    other.close()


def test_no_answer_in_time_is_deadline_exceeded_and_closes_the_stream(stubs):
    stream = QuorumStream()  # alone: min_replicas is 2, so this round cannot close
    with pytest.raises(grpc.RpcError) as err:
        stream.ask(stubs[0], request(0, 0), 0.3)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "no quorum answer for step 0 within 0.3s" in err.value.details()
    assert not stream.open

"""The diagnosis through the real servers: ReportTelemetry over gRPC from registered agents, the
finding and the eviction in GET /api/v1/diagnoses (paged), events and /metrics; refusals."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest

from controller.core.commands import Tick
from controller.settings import ControllerSettings
from controller.core.diagnosis.settings import DiagnosisSettings
from protos import controller_pb2 as pb
from protos.telemetry_ring import Kind

from .conftest import quorum_request


@pytest.fixture
def settings():
    return ControllerSettings(job_id="t", replicas=3, min_replicas=2, join_timeout_s=1.0, heartbeat_timeout_s=60.0,
                              diagnosis=DiagnosisSettings(hang_after_s=30.0, analysis_interval_s=1.0))


SECRETS: dict[str, str] = {}


async def register(stub, host, replica="", rank=0, spare=False):
    answer = await stub.RegisterAgent(pb.RegisterAgentRequest(
        host_id=host, incarnation=f"i-{host}", spare=spare, slots=1,
        assignment=None if spare else pb.Assignment(replica_id=replica, ranks=[rank], world_size=2)))
    SECRETS[host] = answer.agent_secret
    return answer


def group(name, kind, joined, done, size, pending=None):
    g = pb.GroupTelemetry(group=name, kind=int(kind), size=size, last_joined_seq=joined, last_done_seq=done,
                          pending_seq=-1)
    if pending:
        g.pending_seq, g.pending_s, g.pending_nbytes, g.pending_sent_bytes, g.pending_idle_s = pending
    return g


def report(host, replica, rank, hung_rank):
    """r1/1 never joined r1's collective #11; everybody else waits 40 s."""
    culprit = (replica, rank) == ("r1", hung_rank)
    if culprit:
        groups = [group("replica", Kind.REDUCE_SCATTER, 10, 10, 2), group("ftar.q1", Kind.FTAR_ALL_REDUCE, 20, 20, 3)]
    elif replica == "r1":
        groups = [group("replica", Kind.REDUCE_SCATTER, 11, 10, 2, (11, 40.0, 1 << 20, 4096, 39.0)),
                  group("ftar.q1", Kind.FTAR_ALL_REDUCE, 20, 20, 3)]
    else:
        groups = [group("replica", Kind.REDUCE_SCATTER, 11, 11, 2),
                  group("ftar.q1", Kind.FTAR_ALL_REDUCE, 21, 20, 3, (21, 38.0, 1 << 20, 8192, 37.0))]
    return pb.TelemetryReport(host_id=host, agent_secret=SECRETS.get(host, ""), window_collectives=8, ranks=[
        pb.RankTelemetry(replica_id=replica, rank=rank, idle_s=45.0 if culprit else 1.0, recording_s=600, groups=groups)])


def _ages(rank: pb.RankTelemetry, idle_s=None, recording_s=None, pending_s=None, pending_idle_s=None) -> None:
    """Set a rank's ages and those of its pending collective (its ftar.q1 group)."""
    pending = [g for g in rank.groups if g.pending_seq != -1][0]
    for m, name, value in ((rank, "idle_s", idle_s), (rank, "recording_s", recording_s),
                           (pending, "pending_s", pending_s), (pending, "pending_idle_s", pending_idle_s)):
        if value is not None:
            setattr(m, name, value)


async def test_a_hang_reported_by_agents_is_found_evicted_and_shown(server, stub, clock):
    layout = [(f"h{r}{k}", f"r{r}", k) for r in range(3) for k in range(2)]
    for host, replica, rank in layout:
        await register(stub, host, replica, rank)
    await register(stub, "spare", spare=True)
    answers = await asyncio.gather(*(stub.Quorum(quorum_request(f"r{r}", 0, host_id=f"h{r}0"), timeout=10) for r in range(3)))
    assert len({a.quorum_id for a in answers}) == 1
    for host, replica, rank in layout:
        answer = await stub.ReportTelemetry(report(host, replica, rank, hung_rank=1))
        assert list(answer.ignored) == []
    clock.advance(1.0)
    await server.apply(Tick())
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        page = (await http.get("/api/v1/diagnoses")).json()
        [f] = page["findings"]
        assert f["kind"] == "hang" and f["hosts"][0] == "h11" and f["ranks"] == ["r1/1"]
        assert f["action"] == "evict" and f["action_host"] == "h11" and f["confidence"] == 0.95
        assert any("never joined" in e for e in f["evidence"])
        assert page["findings_by_kind"]["hang"] == 1 and page["actions_by_kind"]["evict"] == 1
        assert page["dry_run"] is False and page["next_before_id"] is None
        hosts = {h["host_id"]: h for h in (await http.get("/api/v1/hosts")).json()}
        assert hosts["h11"]["cordoned"] and hosts["spare"]["assignment"]["replica_id"] == "r1"
        events = [e for e in (await http.get("/api/v1/events")).json() if e["kind"] == "diagnosis"]
        assert "evict host h11" in events[0]["message"]
        metrics = (await http.get("/metrics")).text
        assert 'fthsdp_diagnosis_findings_total{job_id="t",kind="hang"} 1.0' in metrics
        assert 'fthsdp_diagnosis_actions_total{job_id="t",kind="evict"} 1.0' in metrics
        assert 'fthsdp_diagnosis_findings_total{job_id="t",kind="sdc"} 0.0' in metrics
        assert (await http.get("/api/v1/diagnoses?kind=sdc")).json()["findings"] == []
        bad = await http.get("/api/v1/diagnoses?limit=100000")
        assert bad.status_code == 422 and "limit" in bad.json()["detail"]


async def test_findings_are_paged_newest_first(server):
    from controller.core.diagnosis.findings import ActionKind, Decision, Finding, FindingKind
    log = server.state.diagnosis.log
    for i in range(7):
        log.add(Finding(FindingKind.STRAGGLER, f"k{i}", float(i), ("h",), 0.9, f"finding {i}"),
                Decision(ActionKind.REPORT, "h", "test"), float(i))
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        first = (await http.get("/api/v1/diagnoses?limit=3")).json()
        assert [f["id"] for f in first["findings"]] == [7, 6, 5] and first["next_before_id"] == 5
        second = (await http.get(f"/api/v1/diagnoses?limit=3&before_id={first['next_before_id']}")).json()
        assert [f["id"] for f in second["findings"]] == [4, 3, 2]


@pytest.mark.parametrize("mutate, code, text", [
    (lambda r: setattr(r, "agent_secret", "stolen"), grpc.StatusCode.PERMISSION_DENIED, "the agent secret is wrong"),
    (lambda r: setattr(r, "agent_secret", ""), grpc.StatusCode.PERMISSION_DENIED, "the agent secret is missing"),
    (lambda r: setattr(r, "host_id", "stranger"), grpc.StatusCode.NOT_FOUND, "unknown"),
    (lambda r: setattr(r, "window_collectives", 0), grpc.StatusCode.INVALID_ARGUMENT, "window_collectives"),
    (lambda r: r.ranks.extend([r.ranks[0]] * 1024), grpc.StatusCode.INVALID_ARGUMENT, "at most 1024 ranks"),
    (lambda r: setattr(r.ranks[0], "idle_s", float("inf")), grpc.StatusCode.INVALID_ARGUMENT, "finite"),
    (lambda r: setattr(r.ranks[0].groups[0], "group", "no spaces"), grpc.StatusCode.INVALID_ARGUMENT, "letters"),
    (lambda r: r.ranks[0].groups[0].windows.extend([pb.TelemetryWindow()] * 9), grpc.StatusCode.INVALID_ARGUMENT,
     "9 windows; the limit is 8"),
    (lambda r: setattr(r.ranks[0].groups[0], "last_done_seq", 99), grpc.StatusCode.INVALID_ARGUMENT,
     "cannot be past last_joined_seq"),
    # consistent, not only in range (issue 39): no age longer than the time it is part of
    (lambda r: _ages(r.ranks[0], recording_s=10, pending_s=1e6, pending_idle_s=1e6), grpc.StatusCode.INVALID_ARGUMENT,
     "rank r0/0 group ftar.q1: pending_s 1e+06 s is longer than recording_s 10 s"),
    (lambda r: _ages(r.ranks[0], idle_s=11, recording_s=10), grpc.StatusCode.INVALID_ARGUMENT,
     "rank r0/0: idle_s 11 s is longer than recording_s 10 s"),
    (lambda r: _ages(r.ranks[0], pending_s=5, pending_idle_s=6), grpc.StatusCode.INVALID_ARGUMENT,
     "group ftar.q1: pending_idle_s 6 s is longer than pending_s 5 s"),
    (lambda r: setattr(r.ranks[0].groups[0], "pending_s", 3.0), grpc.StatusCode.INVALID_ARGUMENT,
     "group replica: pending_seq -1 (nothing pending) with pending_s 3.0"),
    (lambda r: r.ranks[0].groups[0].windows.append(pb.TelemetryWindow(index=0, own_s=700.0)),
     grpc.StatusCode.INVALID_ARGUMENT, "group replica window 0: own_s 700 s is longer than recording_s 600 s"),
])
async def test_bad_or_foreign_reports_are_refused_and_keep_nothing(server, stub, mutate, code, text):
    await register(stub, "h00", "r0", 0)
    r = report("h00", "r0", 0, hung_rank=1)
    mutate(r)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportTelemetry(r)
    assert err.value.code() == code and text in err.value.details()
    assert server.state.diagnosis.ranks == {}


async def test_a_host_speaks_only_for_its_own_ranks(server, stub):
    await register(stub, "h00", "r0", 0)
    r = report("h00", "r0", 0, hung_rank=1)
    r.ranks.append(report("h00", "r2", 1, hung_rank=1).ranks[0])
    answer = await stub.ReportTelemetry(r)
    assert list(answer.ignored) == ["rank r2/1: host h00 does not run it"]
    assert list(server.state.diagnosis.ranks) == [("r0", 0)]

"""Prometheus metrics: gauges and counters read from the state at scrape time, plus the
quorum latency histogram observed as rounds close."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controller.core.model import HostState, ReplicaState

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)


class StateCollector:
    def __init__(self, server) -> None:
        self._server = server

    def collect(self):
        state = self._server.state
        leading = GaugeMetricFamily("fthsdp_controller_leader", "1 when this controller is the active leader")
        leading.add_metric([], 1.0 if self._server.leading else 0.0)
        yield leading
        if state is None:
            return
        by_state = GaugeMetricFamily("fthsdp_replicas", "Replicas by state", labels=["state"])
        for s in ReplicaState:
            by_state.add_metric([s.value], sum(1 for r in state.replicas.values() if r.state == s))
        yield by_state
        healthy = GaugeMetricFamily("fthsdp_replicas_healthy", "Replicas at the quorum's max step")
        healthy.add_metric([], sum(1 for r in state.replicas.values() if r.state == ReplicaState.HEALTHY))
        yield healthy
        total = GaugeMetricFamily("fthsdp_replicas_total", "Configured replica count")
        total.add_metric([], state.settings.replicas)
        yield total
        size = GaugeMetricFamily("fthsdp_quorum_size", "Members of the current quorum")
        size.add_metric([], len(state.quorum.members) if state.quorum else 0)
        yield size
        qid = GaugeMetricFamily("fthsdp_quorum_id", "Current quorum id")
        qid.add_metric([], state.quorum.quorum_id if state.quorum else 0)
        yield qid
        hosts = GaugeMetricFamily("fthsdp_hosts", "Hosts by state", labels=["state"])
        for s in HostState:
            hosts.add_metric([s.value], sum(1 for h in state.hosts.values() if h.state == s))
        yield hosts
        spares = GaugeMetricFamily("fthsdp_spares_free", "Live, uncordoned spare hosts")
        spares.add_metric([], sum(1 for h in state.hosts.values() if h.state == HostState.SPARE and not h.cordoned))
        yield spares
        cordoned = GaugeMetricFamily("fthsdp_hosts_cordoned", "Cordoned hosts")
        cordoned.add_metric([], sum(1 for h in state.hosts.values() if h.cordoned))
        yield cordoned
        steps = CounterMetricFamily("fthsdp_steps_committed", "Committed steps reported by replica leaders")
        steps.add_metric([], state.steps_committed)
        yield steps
        deaths = CounterMetricFamily("fthsdp_replica_deaths", "Replica deaths by cause", labels=["cause"])
        for cause, n in sorted(state.deaths.items()):
            deaths.add_metric([cause], n)
        yield deaths
        swaps = CounterMetricFamily("fthsdp_spare_swaps", "Hosts replaced by a spare")
        swaps.add_metric([], state.swaps)
        yield swaps
        mismatches = CounterMetricFamily("fthsdp_digest_mismatches",
                                         "Steps whose replica digests disagreed (each one an event)")
        mismatches.add_metric([], state.digest_mismatches)
        yield mismatches
        completed = GaugeMetricFamily("fthsdp_job_completed", "1 once every replica finished or died (COMPLETED)")
        completed.add_metric([], 1.0 if state.completed_at is not None else 0.0)
        yield completed
        lost = CounterMetricFamily("fthsdp_steps_lost", "Committed steps given up, by how: rolled back past, "
                                   "or abandoned when a returning replica's newer state won", labels=["kind"])
        for kind in ("rollback", "abandoned"):
            lost.add_metric([kind], state.steps_lost.get(kind, 0))
        yield lost
        changes = CounterMetricFamily("fthsdp_history_changes", "Quorums that rolled the job back, or forward "
                                      "onto a returning replica's newer state", labels=["kind"])
        for kind in ("rollback", "roll_forward"):
            changes.add_metric([kind], state.history_changes.get(kind, 0))
        yield changes


class Metrics:
    def __init__(self, server) -> None:
        self.registry = CollectorRegistry()
        self.quorum_latency = Histogram(
            "fthsdp_quorum_latency_seconds", "From a round's first join to its answer",
            buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.registry.register(StateCollector(server))

"""Prometheus metrics: gauges and counters read from the leader's state at scrape time, and
histograms observed as things happen (quorum rounds close, steps commit, failures are
detected and recovered).

Every series carries `job_id`; per-replica series add `replica` (tens of replicas: never a
rank or host label, which would mean 100,000 series at scale). A standby exports only
`fthsdp_controller_leader 0`, so sums over all controllers count the leader once.
docs/operations.md lists every metric.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controller.core.model import DeathCause, HostState, ReplicaState
from controller.service.views import replica_rows

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
STEP_BUCKETS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
FAILURE_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
JOB = ["job_id"]


def _gauge(name: str, doc: str, job: str, value: float, family=GaugeMetricFamily):
    """One series of the job (a counter when `family` is CounterMetricFamily)."""
    g = family(name, doc, labels=JOB)
    g.add_metric([job], value)
    return g


def _labelled(family, name: str, doc: str, job: str, label: str, values: dict):
    """A gauge or counter family with one series per `label` value."""
    f = family(name, doc, labels=JOB + [label])
    for key, value in values.items():
        f.add_metric([job, key], value)
    return f


def _by_state(name: str, doc: str, job: str, states, records) -> GaugeMetricFamily:
    return _labelled(GaugeMetricFamily, name, doc, job, "state", {s.value: sum(r.state == s for r in records)
                                                                  for s in states})


class StateCollector:
    def __init__(self, server) -> None:
        self._server = server

    def collect(self):
        srv = self._server
        job = srv.settings.job_id
        yield _gauge("fthsdp_controller_leader", "1 when this controller is the active leader", job,
                     1.0 if srv.leading else 0.0)
        state = srv.state
        if state is None or not srv.leading:
            return
        yield from self._replicas(state, job)
        yield from self._hosts(state, job)
        yield from self._goodput(state, job, srv.clock())
        yield from self._diagnosis(state, job)
        port = srv.quorum
        if port is not None:
            yield _gauge("fthsdp_quorum_port_connections", "Open connections to the quorum port", job,
                         len(port.connections))
            yield _gauge("fthsdp_quorum_port_answers", "Quorum answers sent on the quorum port", job, port.answers,
                         CounterMetricFamily)
            yield _gauge("fthsdp_quorum_port_reports", "Commit reports answered on the quorum port", job,
                         port.reports, CounterMetricFamily)
            yield _labelled(CounterMetricFamily, "fthsdp_quorum_port_refusals", "Quorum port connections refused, "
                            "by the gRPC code of the refusal", job, "code", dict(port.refusals))

    def _diagnosis(self, state, job: str):
        log = state.diagnosis.log
        yield _labelled(CounterMetricFamily, "fthsdp_diagnosis_findings", "Diagnosis findings by kind (hang, "
                        "straggler, sdc); each one is in /api/v1/diagnoses with its evidence", job, "kind",
                        dict(sorted(log.findings_by_kind.items())))
        yield _labelled(CounterMetricFamily, "fthsdp_diagnosis_actions", "What the diagnosis did about its findings: "
                        "evict, dry_run (would have evicted), hold (a limit), report", job, "kind",
                        dict(sorted(log.actions_by_kind.items())))

    def _replicas(self, state, job: str):
        replicas = list(state.replicas.values())
        # the rows of /api/v1/replicas: replicas its hosts run that never joined count too
        rows = replica_rows(state, self._server.clock())
        yield _labelled(GaugeMetricFamily, "fthsdp_replicas", "Replicas by state (those that never joined too)", job,
                        "state", {s.value: sum(r["state"] == s.value for r in rows) for s in ReplicaState})
        yield _gauge("fthsdp_replicas_healthy", "Replicas at the quorum's max step", job,
                     sum(r.state == ReplicaState.HEALTHY for r in replicas))
        yield _gauge("fthsdp_replicas_total", "Configured replica count", job, state.settings.replicas)
        yield _gauge("fthsdp_min_replicas", "Fewest replicas a round may close with", job, state.settings.min_replicas)
        yield _labelled(GaugeMetricFamily, "fthsdp_sync_mode", "1 for the mode the replicas meet in (sync, local_sgd, "
                        "diloco, streaming_diloco)", job, "mode", {state.settings.sync_mode: 1.0})
        yield _gauge("fthsdp_sync_every_steps", "Inner steps between two syncs of the whole model (1: every step)", job,
                     state.settings.sync_every_steps)
        yield _gauge("fthsdp_sync_fragments", "Fragments synced on staggered schedules (streaming_diloco; else 1)", job,
                     state.settings.sync_fragments)
        yield _gauge("fthsdp_quorum_size", "Members of the current quorum", job,
                     len(state.quorum.members) if state.quorum else 0)
        yield _gauge("fthsdp_quorum_id", "Current quorum id", job, state.quorum.quorum_id if state.quorum else 0)
        yield _gauge("fthsdp_quorum_lr_scale", "Learning-rate factor of the current quorum", job,
                     state.quorum.lr_scale if state.quorum else 1.0)
        yield _gauge("fthsdp_job_committed_step", "Highest step any replica committed (-1: none yet)", job,
                     state.max_committed_step)
        ordered = sorted(replicas, key=lambda r: r.replica_id)
        yield _labelled(GaugeMetricFamily, "fthsdp_replica_healthy", "1 while the replica is HEALTHY", job, "replica",
                        {r.replica_id: float(r.state == ReplicaState.HEALTHY) for r in ordered})
        yield _labelled(GaugeMetricFamily, "fthsdp_replica_committed_step", "The replica's last committed step", job,
                        "replica", {r.replica_id: r.committed_step for r in ordered})
        yield _labelled(CounterMetricFamily, "fthsdp_replica_deaths", "Replica deaths by cause", job, "cause",
                        dict(sorted(state.deaths.items())))
        yield _gauge("fthsdp_digest_mismatches", "Steps whose replica digests disagreed (each one an event)", job,
                     state.digest_mismatches, CounterMetricFamily)
        yield _gauge("fthsdp_job_completed", "1 once every replica finished or died (COMPLETED)", job,
                     1.0 if state.completed_at is not None else 0.0)
        yield _gauge("fthsdp_job_failed", "1 once the job FAILED: no replica could make progress for fail_after_s",
                     job, 1.0 if state.failed_at is not None else 0.0)
        yield _labelled(CounterMetricFamily, "fthsdp_steps_lost", "Committed steps given up, by how: rolled back "
                        "past, or abandoned when a returning replica's newer state won", job, "kind",
                        {kind: state.steps_lost.get(kind, 0) for kind in ("rollback", "abandoned")})
        yield _labelled(CounterMetricFamily, "fthsdp_history_changes", "Quorums that rolled the job back, or "
                        "forward onto a returning replica's newer state", job, "kind",
                        {kind: state.history_changes.get(kind, 0) for kind in ("rollback", "roll_forward")})

    def _hosts(self, state, job: str):
        registry = state
        hosts = list(registry.hosts.values())
        yield _by_state("fthsdp_hosts", "Hosts by state", job, HostState, hosts)
        yield _gauge("fthsdp_spares_free", "Live, uncordoned spare hosts", job,
                     sum(h.state == HostState.SPARE and not h.cordoned for h in hosts))
        yield _gauge("fthsdp_hosts_cordoned", "Cordoned hosts", job, sum(h.cordoned for h in hosts))
        yield _gauge("fthsdp_spare_swaps", "Hosts replaced by a spare", job, registry.swaps, CounterMetricFamily)

    def _goodput(self, state, job: str, now: float):
        if not state.settings.telemetry:
            return
        v = state.goodput.view(now)
        yield _gauge("fthsdp_job_effective_training_ratio",
                     "Replica-time covered by committed, trained steps over replicas x wall time", job,
                     v.effective_training_ratio)
        yield _gauge("fthsdp_job_wall_seconds", "Seconds since the job's first join", job, v.wall_s)
        yield _gauge("fthsdp_job_committed_steps_per_second",
                     "Advances of the job's committed step per second over the last window", job,
                     v.committed_steps_per_s)
        per = v.replicas
        yield _labelled(GaugeMetricFamily, "fthsdp_replica_effective_training_ratio",
                        "The replica's covered time over the job's wall time", job, "replica",
                        {rid: g["effective_training_ratio"] for rid, g in per.items()})
        yield _labelled(CounterMetricFamily, "fthsdp_replica_commits", "Commits reported by the replica's coordinator",
                        job, "replica", {rid: g["commits"] for rid, g in per.items()})
        yield _labelled(CounterMetricFamily, "fthsdp_replica_failures", "Times the replica was declared DEAD",
                        job, "replica", {rid: g["failures"] for rid, g in per.items()})


class Metrics:
    def __init__(self, server) -> None:
        self.job_id = server.settings.job_id
        self.registry = CollectorRegistry()
        self.quorum_latency = Histogram(
            "fthsdp_quorum_latency_seconds", "From a round's first join to its answer", JOB,
            buckets=LATENCY_BUCKETS_S, registry=self.registry).labels(self.job_id)
        self.step_time = Histogram(
            "fthsdp_step_seconds", "Time covered by each committed, trained step", JOB,
            buckets=STEP_BUCKETS_S, registry=self.registry).labels(self.job_id)
        self._detect = Histogram(
            "fthsdp_failure_detection_seconds",
            "From a replica's last sign of life to its declared death, by cause", JOB + ["cause"],
            buckets=FAILURE_BUCKETS_S, registry=self.registry)
        self.recover = Histogram(
            "fthsdp_failure_recovery_seconds", "From a replica's declared death to HEALTHY again", JOB,
            buckets=FAILURE_BUCKETS_S, registry=self.registry).labels(self.job_id)
        for cause in DeathCause:  # every cause has series from the start (zeros, not "no data")
            self._detect.labels(self.job_id, cause.value)
        self.registry.register(StateCollector(server))

    def observe(self, observations) -> None:
        for o in observations:
            if o.what == "step":
                self.step_time.observe(o.seconds)
            elif o.what == "detect":
                self._detect.labels(self.job_id, o.cause or "unknown").observe(o.seconds)
            elif o.what == "recover":
                self.recover.observe(o.seconds)

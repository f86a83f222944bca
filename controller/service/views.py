"""The status API's JSON: plain functions from the controller's read-only view (controller.core.view) to dicts."""

from __future__ import annotations

from dataclasses import asdict

from controller.core.model import NO_CHECKPOINT, HostState, JobState, Quorum, Replica, ReplicaState, host_can_run
from controller.core.stalls import Pause, find_stalls


def quorum_view(q: Quorum | None) -> dict | None:
    if q is None:
        return None
    return {
        "quorum_id": q.quorum_id, "max_step": q.max_step, "lr_scale": q.lr_scale, "reason": q.reason,
        "formed_at": q.formed_at, "members": [asdict(m) for m in q.members],
        "recover": {k: list(v) for k, v in q.recover.items()},
    }


def goodput_view(state, now: float) -> dict:
    v = state.goodput.view(now)
    return {
        "effective_training_ratio": v.effective_training_ratio, "wall_s": v.wall_s, "started_at": v.started_at,
        "committed_steps_per_s": v.committed_steps_per_s, "window_s": v.window_s,
        "replicas": v.replicas, "recent_failures": list(v.recent_failures),
    }


def job_view(state, leader: str, leading: bool, now: float) -> dict:
    """The job's summary. The replica counts are those of `replica_rows` (every replica the
    job has, joined or not), so they agree with the replicas table and the job's reason."""
    rows = replica_rows(state, now)
    count = lambda s: sum(r["state"] == s.value for r in rows)  # noqa: E731
    failing_since = state.failing_since
    fails_at = None if failing_since is None else failing_since + state.settings.fail_after_s
    return {
        "job_id": state.settings.job_id,
        "leader": leader,
        "this_controller_leads": leading,
        "replicas_total": state.settings.replicas,
        "replicas_known": len(rows),
        "replicas_healthy": count(ReplicaState.HEALTHY),
        "replicas_behind": count(ReplicaState.BEHIND),
        "replicas_joining": count(ReplicaState.JOINING),
        "replicas_dead": count(ReplicaState.DEAD),
        "replicas_diverged": count(ReplicaState.DIVERGED),
        "replicas_finished": count(ReplicaState.FINISHED),
        "job_state": state.job_state.value,
        "job_state_reason": state.job_state_reason,
        # RUNNING, but no replica can make progress: FAILED at `fails_at` unless one can again
        "failing": failing_since is not None,
        "fails_at": fails_at,
        "fails_in_s": None if fails_at is None else round(max(fails_at - now, 0.0), 3),
        "completed_at": state.completed_at,
        "failed_at": state.failed_at,
        "digest_mismatches": state.digest_mismatches,
        "min_replicas": state.settings.min_replicas,
        # the current quorum and the step its members train (both 0: no quorum yet)
        "quorum_id": state.quorum.quorum_id if state.quorum else 0,
        "max_step": state.quorum.max_step if state.quorum else 0,
        "lr_scale": state.quorum.lr_scale if state.quorum else 1.0,
        "sync_mode": state.settings.sync_mode,
        "sync_every_steps": state.settings.sync_every_steps,
        "sync_fragments": state.settings.sync_fragments,
        "round": {"joined": sorted(state.round_joined), "reason": state.round_reason},
        # the job's newest committed step (-1: none yet)
        "committed_step": state.max_committed_step,
        # commit reports counted: one per replica per committed step (not a step number);
        # `steps_committed` is its older name, kept for existing readers
        "replica_commits": state.steps_committed,
        "steps_committed": state.steps_committed,
        "spares_free": sum(h.state == HostState.SPARE and not h.cordoned for h in state.hosts.values()),
        "swaps": state.swaps,
        "deaths": dict(state.deaths),
        "history_step": state.history_step,
        "steps_lost": dict(state.steps_lost),
        "history_changes": dict(state.history_changes),
        "newest_checkpoint_step": state.newest_checkpoint_step,
        # None until a replica joined; False: a failure of every replica restarts from step 0
        "durable_checkpoint": (durable := state.durable_checkpoint()),
        "checkpoint_warning": f"no durable checkpoint: {NO_CHECKPOINT}" if durable is False else "",
        "telemetry": state.settings.telemetry,
        "goodput": goodput_view(state, now),
    }


def replica_view(r, now: float) -> dict:
    return {
        "replica_id": r.replica_id, "state": r.state.value, "reason": r.reason, "step": r.step,
        "committed_step": r.committed_step, "world_size": r.world_size, "incarnation": r.incarnation,
        "leader_address": r.coordinator_address, "seconds_since_seen": round(max(now - r.last_seen, 0.0), 3),
        "last_loss": r.last_loss, "last_step_time_s": r.last_step_time_s, "tokens": r.tokens,
        "digest": r.digest, "digest_step": r.digest_step, "diverged": r.state == ReplicaState.DIVERGED,
        "restarts": r.restarts, "checkpoint_every_steps": r.checkpoint_every_steps,
    }


def replica_rows(state, now: float) -> list[dict]:
    """Every replica the job has, by id: those that joined, and those its hosts run that never
    joined (their trainers start, or die before their first join): DEAD while one of their
    hosts cannot run (the job's failure rule counts them so) or once the job ended, JOINING
    otherwise."""
    hosts: dict[str, list] = {}
    for h in state.hosts.values():
        if h.assignment is not None and h.assignment.replica_id not in state.replicas:
            hosts.setdefault(h.assignment.replica_id, []).append(h)
    rows = {rid: replica_view(r, now) for rid, r in state.replicas.items()}
    for rid, held in hosts.items():
        held.sort(key=lambda h: h.host_id)
        down = next((h for h in held if not host_can_run(h)), None)
        cause = state.exit_causes.get(rid, "")
        died = f"its trainers died ({cause}); " if cause else ""
        if down is not None:
            why = down.cordon_reason if down.cordoned else "its agent is DEAD"
            reason = f"never joined: {died}host {down.host_id} cannot run ({why})"
        else:
            reason = f"not joined yet: {died}its trainers start on host(s) {', '.join(h.host_id for h in held)}"
        if down is None and state.job_over:
            down, reason = held[0], f"never joined: {died}the job is {state.job_state.value}"
        r = Replica(rid, ReplicaState.DEAD if down is not None else ReplicaState.JOINING, reason,
                    world_size=held[0].assignment.world_size, last_seen=max(h.last_seen for h in held))
        rows[rid] = replica_view(r, now)
    return [rows[rid] for rid in sorted(rows)]


def host_view(h, now: float, reasons: dict | None = None) -> dict:
    """A host. A live cordoned host that runs nothing (out of the spare pool: never SPARE) or
    that was cordoned after a failure (its work waits for a spare: it runs nothing either)
    reads CORDONED; an operator's cordon of an ACTIVE host leaves it ACTIVE (it keeps its work)."""
    pooled = h.state == HostState.SPARE and not h.cordoned
    out = h.cordoned and h.state != HostState.DEAD and (h.assignment is None or h.cordon_by == "failure")
    state = "CORDONED" if out else h.state.value
    return {
        "host_id": h.host_id, "state": state, "spare": pooled, "standby": h.standby,
        "assignment": asdict(h.assignment) if h.assignment else None, "labels": h.labels, "slots": h.slots,
        "cordoned": h.cordoned, "cordon_reason": h.cordon_reason, "cordoned_by": h.cordon_by,
        "incarnation": h.incarnation, "finishing_trainers": h.finishing_trainers,
        "assignment_version": h.assignment_version, "address": h.address,
        "seconds_since_seen": round(max(now - h.last_seen, 0.0), 3),
        "state_reason": (reasons or {}).get(h.host_id, "") or (
            f"finishing: {h.finishing_trainers} trainer(s) still run their own work after the job COMPLETED"
            if h.finishing_trainers else ""),
    }


#: Event kinds that say why a host is DEAD (their subject is the host).
HOST_GONE_KINDS = ("host_death", "host_left")


def host_reasons(state) -> dict:
    """host id -> why it is DEAD: the message of its newest recent event saying how it died
    or left. Hosts that are not DEAD, or whose event is no longer recent, are absent."""
    out = {}
    for e in state.events:
        h = state.hosts.get(e.subject) if e.kind in HOST_GONE_KINDS else None
        if h is not None and h.state == HostState.DEAD:
            out[e.subject] = e.message
    return out


def _pause_view(p: Pause | None) -> dict | None:
    if p is None:
        return None
    return {"start": p.start, "end": p.end, "seconds": round(p.seconds, 3), "step": p.step, "ongoing": p.ongoing}


def stalls_view(state, now: float) -> dict:
    """When the job stood still and the failures behind it (controller.core.stalls)."""
    running = state.job_state == JobState.RUNNING
    timeline = state.goodput.timeline()
    ended = next((at for at in (state.completed_at, state.failed_at) if at is not None),
                 timeline[-1][0] if timeline else now)
    # The history holds each quorum id as it first formed (`state.quorum` is the current one as
    # its latest round re-formed it, on the fast path with the same id and a later time).
    quorums = [(q.formed_at, q.quorum_id, q.reason) for q in state.quorum_history]
    report = find_stalls(timeline, [dict(f.__dict__) for f in state.goodput.failures], quorums,
                         now if running else ended, running)
    return {
        "typical_step_s": report.typical_step_s, "threshold_s": report.threshold_s,
        "stalls": [{**_pause_view(s.pause), "failures": [{"replica": r, "died_at": at} for r, at in s.failures],
                    "quorum_id": s.quorum_id, "quorum_reason": s.quorum_reason} for s in report.stalls],
        "failures": [{**f.failure, "stall": _pause_view(f.pause)} for f in report.failures],
    }

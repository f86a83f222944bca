"""The status API's JSON: plain functions from ControllerState to dicts."""

from __future__ import annotations

from dataclasses import asdict

from controller.core.model import HostState, JobState, Quorum, ReplicaState
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
    replicas = list(state.replicas.values())
    return {
        "job_id": state.settings.job_id,
        "leader": leader,
        "this_controller_leads": leading,
        "replicas_total": state.settings.replicas,
        "replicas_healthy": sum(r.state == ReplicaState.HEALTHY for r in replicas),
        "replicas_behind": sum(r.state == ReplicaState.BEHIND for r in replicas),
        "replicas_dead": sum(r.state == ReplicaState.DEAD for r in replicas),
        "replicas_diverged": sum(r.state == ReplicaState.DIVERGED for r in replicas),
        "replicas_finished": sum(r.state == ReplicaState.FINISHED for r in replicas),
        "job_state": state.job_state.value,
        "job_state_reason": state.job_state_reason,
        "completed_at": state.completed_at,
        "failed_at": state.failed_at,
        "digest_mismatches": state.digest_mismatches,
        "min_replicas": state.settings.min_replicas,
        "quorum_id": state.quorum.quorum_id if state.quorum else 0,
        "max_step": state.quorum.max_step if state.quorum else 0,
        "lr_scale": state.quorum.lr_scale if state.quorum else 1.0,
        "round": {"joined": sorted(state.round_joined), "reason": state.round_reason},
        "committed_step": state.max_committed_step,
        "steps_committed": state.steps_committed,
        "spares_free": sum(h.state == HostState.SPARE and not h.cordoned for h in state.host_registry.hosts.values()),
        "swaps": state.host_registry.swaps,
        "deaths": dict(state.deaths),
        "history_step": state.history_step,
        "steps_lost": dict(state.steps_lost),
        "history_changes": dict(state.history_changes),
        "newest_checkpoint_step": state.newest_checkpoint_step,
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
        "restarts": r.restarts,
    }


def host_view(h, now: float, reasons: dict | None = None) -> dict:
    return {
        "host_id": h.host_id, "state": h.state.value, "spare": h.state == HostState.SPARE, "standby": h.standby,
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
        h = state.host_registry.hosts.get(e.subject) if e.kind in HOST_GONE_KINDS else None
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

"""A quorum as the replicas and journal sections hold it, and back. Pure."""

from __future__ import annotations

from controller.core.model import Member, Quorum


def quorum_to_dict(q: Quorum) -> dict:
    """Every field of `q` (what dataclasses.asdict gives, written out: asdict deep-copies each
    value, and this runs on every committed step's write)."""
    return {
        "quorum_id": q.quorum_id,
        "members": [{"replica_id": m.replica_id, "step": m.step, "healthy": m.healthy} for m in q.members],
        "max_step": q.max_step, "recover": {k: list(v) for k, v in q.recover.items()}, "lr_scale": q.lr_scale,
        "reason": q.reason, "formed_at": q.formed_at, "resume_checkpoint_step": q.resume_checkpoint_step,
    }


def quorum_from_dict(d: dict) -> Quorum:
    return Quorum(
        quorum_id=d["quorum_id"], members=tuple(Member(**m) for m in d["members"]), max_step=d["max_step"],
        recover={k: tuple(v) for k, v in d["recover"].items()}, lr_scale=d["lr_scale"], reason=d["reason"],
        formed_at=d["formed_at"], resume_checkpoint_step=d.get("resume_checkpoint_step"),
    )

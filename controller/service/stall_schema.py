"""The OpenAPI schema of /api/v1/stalls (controller.core.stalls says what the words mean)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PauseView(BaseModel):
    start: float = Field(description="when the committed step reached `step` (controller clock, seconds since the epoch)")
    end: float = Field(description="when it next went up; for an ongoing pause, now")
    seconds: float = Field(description="how long the job stood still")
    step: int = Field(description="the committed step the job stood at")
    ongoing: bool = Field(description="the job still stands still (it runs and has not committed since)")


class StallFailure(BaseModel):
    replica: str
    died_at: float = Field(description="when the controller declared it DEAD")


class StallView(PauseView):
    failures: list[StallFailure] = Field(
        description="failures whose window (the replica's last sign of life to its declaration) overlaps the stall")
    quorum_id: int = Field(description="the last quorum formed inside the stall, the one the job went on with (0: none)")
    quorum_reason: str = Field(description="why that quorum closed")


class FailureWithStall(BaseModel):
    replica: str
    cause: str
    died_at: float
    detect_s: float = Field(description="from the replica's last sign of life to its declaration")
    recovered_at: float | None
    recover_s: float | None = Field(description="from its declaration to the replica HEALTHY again (null: not yet)")
    stall: PauseView | None = Field(
        description="the longest pause overlapping the failure's window: how long the job stood still around "
                    "it, which may be far longer than recover_s (null: the timeline does not reach back to it)")


class StallsView(BaseModel):
    typical_step_s: float | None = Field(description="the median seconds per committed step: the job's pace")
    threshold_s: float = Field(description="the shortest pause that is a stall: 3 typical steps, at least 1 s")
    stalls: list[StallView] = Field(description="pauses of at least threshold_s, oldest first")
    failures: list[FailureWithStall] = Field(description="the recent failures, oldest first, each with its stall")

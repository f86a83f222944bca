"""Which job a starting controller serves: a job id is never reused silently.

A controller keeps its job under its job id in the store (etcd: the prefix /fthsdp/{job_id}).
A store that already holds a *finished* job (COMPLETED or FAILED) under the id asked for would
hand the new controller that ending: no quorum forms, its agents stop and exit as if the job
had been theirs. So a controller started on such a store refuses, naming the id and how it
ended; with `--new-job` it serves the first id of `job_id`, `job_id-2`, `job_id-3`, ... that
the store holds no finished job for, and says which.

A job the store holds RUNNING is served as it is (a standby, a restarted controller of the
same job), with or without `--new-job`: every controller of one job started with the same
flags arrives at the same id.

    choose_job_id(asked, endings, new_job) -> JobIdChoice(job_id or "", reason)

`endings[i]` is how the store's job `candidates(asked)[i]` ended (None: it did not, or there
is none); the caller reads them in order, stops after the first None, and reads at most
MAX_CANDIDATES (without `new_job`, only the first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: How many ids `--new-job` tries (job, job-2, ..., job-1000) before it gives up.
MAX_CANDIDATES = 1000


@dataclass(frozen=True)
class Ending:
    """How a job in the store ended."""

    state: str  # "COMPLETED" | "FAILED"
    reason: str


@dataclass(frozen=True)
class JobIdChoice:
    """The job id to serve ("" when the controller must refuse) and why, in one sentence."""

    job_id: str
    reason: str


def ending_of(replicas_section: dict | None) -> Ending | None:
    """The ending recorded in a job's durable replicas section (controller.core.snapshots)."""
    if not replicas_section:
        return None
    reason = replicas_section.get("job_end_reason", "") or "no reason recorded"
    if replicas_section.get("completed_at") is not None:
        return Ending("COMPLETED", reason)
    if replicas_section.get("failed_at") is not None:
        return Ending("FAILED", reason)
    return None


def candidates(asked: str, count: int = MAX_CANDIDATES) -> list[str]:
    """The ids `--new-job` tries, in order: the one asked for, then asked-2, asked-3, ..."""
    return [asked] + [f"{asked}-{n}" for n in range(2, count + 1)]


def choose_job_id(asked: str, endings: Sequence[Ending | None], new_job: bool) -> JobIdChoice:
    # The id asked for is unfinished (new, or running): serve it.
    first = endings[0] if endings else None
    if first is None:
        return JobIdChoice(asked, f"job {asked!r} is not finished in the store: this controller serves it")
    ended = f"the store holds job {asked!r} {first.state} ({first.reason})"
    # Finished, and no leave to start another: refuse, saying how to go on.
    if not new_job:
        return JobIdChoice("", f"{ended}; a job id is never reused: give a fresh --job-id for a new job, or "
                               f"--new-job to start the next free id ({asked}-2, ...)")
    # Finished, with --new-job: the first candidate the store holds no finished job for.
    for job_id, ending in zip(candidates(asked, len(endings)), endings):
        if ending is None:
            return JobIdChoice(job_id, f"{ended}; --new-job: this controller serves job {job_id!r}")
    return JobIdChoice("", f"{ended}, and so are the next {len(endings) - 1} ids ({asked}-2 .. "
                           f"{asked}-{len(endings)}): give a fresh --job-id")

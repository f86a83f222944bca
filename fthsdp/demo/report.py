"""What a demo run means, computed from its records (pure: rows and events in, dicts out).

Trainer rows are the JSON lines of `fthsdp.demo.trainer`; events are the controller's
/api/v1/events (wall-clock `at`); injections are what the demo did and when.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from statistics import fmean

from fthsdp import history

#: The baseline's seed-to-seed spread, measured once with `python -m fthsdp.demo.band`.
BAND_FILE = Path(__file__).with_name("baseline_band.json")


def band_path(sync_mode: str = "sync", sync_every: int = 1, sync_fragments: int = 1) -> Path:
    """Where the band of a mode, H (and F, streaming_diloco's fragments) is stored: each
    configuration is compared with its own."""
    if sync_mode == "sync":
        return BAND_FILE
    fragments = f"_f{sync_fragments}" if sync_fragments > 1 else ""
    return BAND_FILE.with_name(f"baseline_band_{sync_mode}_h{sync_every}{fragments}.json")


def leader_rows(rows: list[dict], event: str) -> list[dict]:
    return [r for r in rows if r.get("event") == event and r.get("rank") == 0]


def corrupting(rows: list[dict], injections: list[dict]) -> set[tuple[str, int]]:
    """(replica, pid) of the processes an injected sdc fault made corrupt their state: those of
    its replica that were running when it went live (the diagnosis judges them, and evicts)."""
    return {(r["replica"], r["pid"]) for i in injections if i["kind"] == "sdc" for r in rows
            if r.get("replica") == i["replica"] and r.get("t", 0) < i["injected_at"]}


def identical_after_every_commit(rows: list[dict], injections: list[dict] = ()) -> list[str]:
    """Problems: a step committed in one quorum into different states (rank k of every replica
    holds shard k, so rank by rank). Semi-synchronous, the digest covers the global state: the
    parameters after the outer step, the outer optimizer and the ledger. The commits of a
    process an sdc fault corrupts (`corrupting`) from its injection on are the fault itself."""
    bad = corrupting(rows, injections)
    since = {i["replica"]: i["injected_at"] for i in injections if i["kind"] == "sdc"}
    digests: dict[tuple[int, int, int], dict[str, str]] = defaultdict(dict)
    for r in rows:
        if (r.get("replica"), r.get("pid")) in bad and r.get("t", 0) >= since[r["replica"]]:
            continue
        if r.get("event") == "commit":
            who = f"{r['replica']}/{r['rank']}/{r.get('pid')}"
            digests[(r["step"], r.get("quorum_id", 0), r["rank"])][who] = r["digest"]
    return [f"step {step} (quorum {quorum}) committed into different states: "
            f"{ {k: v[:12] for k, v in sorted(d.items())} }"
            for (step, quorum, _), d in sorted(digests.items()) if len(set(d.values())) > 1]


def landing(injection: dict, rows: list[dict], committed: Counter, every: int = 1) -> dict | None:
    """Where a kill landed, from the killed rank 0's own rows (pid): the step (sync) it was
    training for, the batches of that step it had trained that no commit included with it
    (lost: a sync commits a replica's inner steps only with it), and whether the committed
    history trained each of them later (`committed`: its batches). None without a pid."""
    pid, replica = injection.get("pid"), injection["replica"]
    mine = [r for r in rows if r.get("pid") == pid and r.get("rank") == 0]
    trained = [r for r in mine if r.get("event") == "trained"]
    if not pid or not trained:
        return None
    step = trained[-1]["step"]
    included = [r for r in mine if r.get("event") == "commit" and r["step"] == step and replica in r["included"]]
    lost = [] if included else sorted({r["position"] for r in trained if r["step"] == step})
    served = all(committed[(replica, p)] == 1 for p in lost)
    if every == 1:
        where = f"in step {step}"
    elif len(lost) == every and "sync" in injection.get("moment", ""):
        where = f"in sync {step}, its all-reduce started"
    else:
        where = f"in inner step {trained[-1].get('inner', 0)} of {every} before sync {step}"
    text = where + (f": batches {lost[0]}..{lost[-1]} lost, " + ("served again" if served else "NOT served again")
                    if lost else ": nothing lost (the step committed with it)")
    return {"step": step, "lost_batches": lost, "served_again": served, "text": text}


def history_of(rows: list[dict], replicas: list[str]) -> tuple[dict | None, list[str]]:
    """The committed history the run ended with, from its leaders' rows (fthsdp/history.py),
    and its problems: each batch (replica, position) trained exactly once along it.

    A rollback or a roll-forward commits some steps again into other states; the commits
    it left behind are counted here (how many, of which steps), not reported as problems.
    Each included batch must be one that replica really computed at that step ("trained"
    rows are written before the all-reduce); no batch twice; no position skipped.
    """
    view, problems, _ = _walk(rows, replicas)
    return view, problems


def _walk(rows: list[dict], replicas: list[str]) -> tuple[dict | None, list[str], Counter]:
    """`history_of`, and the batches along the committed history (how often each)."""
    leaders = [r for r in rows if r.get("rank") == 0]  # rank k of a sharded model holds shard k
    walked, problems = history.walk(leaders)
    if walked is None:
        return None, problems, Counter()
    batches, problems = history.exactly_once_along(walked, history.trained_positions(leaders), replicas)
    return {"steps": len(walked.chain), "abandoned_commits": len(walked.abandoned),
            "abandoned_branches": walked.branches, "abandoned_steps": walked.abandoned_steps}, problems, batches


def exactly_once(rows: list[dict], replicas: list[str]) -> list[str]:
    """Problems with committed history (`history_of`); none when each batch was trained once."""
    return history_of(rows, replicas)[1]


def committed_rows(rows: list[dict]) -> list[dict]:
    """The leaders' commit rows of the committed history: what a rollback or a roll-forward
    abandoned is left out. Every leader commit row when the history cannot be walked (then
    `history_of` reports why)."""
    walked, _ = history.walk([r for r in rows if r.get("rank") == 0])
    if walked is None:
        return leader_rows(rows, "commit")
    return [r for c in walked.chain for r in c.rows]


def final_states(rows: list[dict], replicas: list[str], ranks: int) -> tuple[bool, list[str]]:
    """Whether rank k of every replica ended with the same step, parameters and optimizer state
    (rank k's shard of them, when the model is sharded)."""
    last = {(r["replica"], r["rank"]): r for r in rows if r.get("event") == "done"}
    missing = [f"{rep}/{k}" for rep in replicas for k in range(ranks) if (rep, k) not in last]
    if missing:
        return False, [f"no final state from {', '.join(missing)}"]
    problems = []
    for k in range(ranks):
        digests = {f"{rep}/{k}": r["digest"][:12] for (rep, rank), r in sorted(last.items()) if rank == k}
        if len(set(digests.values())) != 1:
            problems.append(f"final states differ: {digests}")
    return not problems, problems


def loss_by_step(rows: list[dict]) -> dict[int, float]:
    """Mean training loss of the batches each committed step trained (healthy leaders, along
    the committed history)."""
    losses: dict[int, list[float]] = defaultdict(list)
    for r in committed_rows(rows):
        if not r["behind"]:
            losses[r["step"]].append(r["loss"])
    return {step: fmean(v) for step, v in sorted(losses.items())}


def samples_by_step(rows: list[dict], batch_rows: int) -> dict[int, int]:
    """Samples the job had trained on after each committed step: every replica whose batch a
    step included adds `batch_rows` (the paper's x-axis is tokens; ours is samples). Along the
    committed history: the batches of the steps a rollback abandoned are not in the model."""
    included: dict[int, int] = {}
    for r in committed_rows(rows):  # a sync commits `batches` (K) per contributor
        included.setdefault(r["step"], len(r["included"]) * r.get("batches", 1))
    total, out = 0, {}
    for step in sorted(included):
        total += included[step] * batch_rows
        out[step] = total
    return out


def loss_by_samples(rows: list[dict], batch_rows: int) -> dict[int, float]:
    """`loss_by_step` keyed by samples seen after the step."""
    samples = samples_by_step(rows, batch_rows)
    return {samples[step]: loss for step, loss in loss_by_step(rows).items() if step in samples}


def baseline_steps_for(samples: int, replicas: int, batch_rows: int) -> int:
    """Steps a no-failure run of `replicas` needs to see `samples` (it includes every replica)."""
    return max(1, math.ceil(samples / (replicas * batch_rows)))


def mean_loss_near(losses: dict[int, float], samples: int, window: int) -> float | None:
    """Mean training loss of the steps that ended within `window` samples before `samples`
    (one batch's loss is noisy; a window of steps is not)."""
    near = [loss for seen, loss in losses.items() if samples - window < seen <= samples]
    return fmean(near) if near else None


def load_band(path: Path = BAND_FILE) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def band_view(band: dict | None, config: dict) -> dict | None:
    """The measured seed-to-seed band, and whether it was measured for this configuration."""
    if not band:
        return None
    accuracy = band["test_accuracy"]
    return {"seeds": band["seeds"], "test_accuracy_min": min(accuracy), "test_accuracy_max": max(accuracy),
            "test_accuracy_spread": round(max(accuracy) - min(accuracy), 5), "config": band["config"],
            "applies": all(config.get(k) == v for k, v in band["config"].items()), "how": band["measured_with"]}


def effective_training_time(rows: list[dict], replicas: int) -> float:
    """Fraction of replica-time in committed healthy steps of the committed history, over the
    training window (first step begun to last step committed) times the configured replicas.
    Steps a rollback or a roll-forward abandoned were trained for nothing: they do not count."""
    steps = [r for r in committed_rows(rows) if not r["behind"]]
    began = [r["began"] for r in rows if r.get("event") in ("commit", "retry") and r.get("rank") == 0]
    if not steps or not began:
        return 0.0
    window = max(r["t"] for r in steps) - min(began)
    if window <= 0:
        return 0.0
    return min(1.0, sum(r["t"] - r["began"] for r in steps) / (replicas * window))


def recovery(injection: dict, events: list[dict]) -> dict:
    """Detection (failure -> replica DEAD) and rejoin (failure -> HEALTHY again), from events."""
    t0, replica = injection["injected_at"], injection["replica"]
    mine = sorted((e for e in events if e.get("subject") == replica and e["at"] >= t0 - 0.05),
                  key=lambda e: e["at"])
    dead = next((e for e in mine if e["kind"] == "death"), None)
    healthy = next((e for e in mine if dead and e["at"] >= dead["at"] and "became HEALTHY" in e["message"]), None)
    return {"detected_at": dead and dead["at"], "detection_s": dead and round(dead["at"] - t0, 3),
            "detected_by": dead and (dead.get("cause") or dead["message"]),
            "rejoined_at": healthy and healthy["at"], "rejoin_s": healthy and round(healthy["at"] - t0, 3)}


def _round(value: float | None, digits: int = 5) -> float | None:
    return None if value is None else round(value, digits)


def summary(rows: list[dict], replicas: list[str], ranks: int, batch_rows: int = 0, injections: list[dict] = (),
            every: int = 1) -> dict:
    """What a run's records say; `injections` (the run's kills) get where each landed (`landing`),
    `every`: K, the training steps per sync (H, or H / F with streaming_diloco's F fragments;
    1: every step is one)."""
    done = [r for r in rows if r.get("event") == "done" and r.get("rank") == 0]
    final = done[-1] if done else {}
    losses = loss_by_step(rows)
    identical, problems = final_states(rows, replicas, ranks)
    walked, once, batches = _walk(rows, replicas)
    differing = identical_after_every_commit(rows, list(injections))
    return {
        "identical_after_every_commit": not differing,
        "landings": [landing(i, rows, batches, every) for i in injections],
        "steps": final.get("step", 0),
        "final_train_loss": round(losses[max(losses)], 5) if losses else None,
        "test_loss": _round(final.get("test_loss")), "test_accuracy": _round(final.get("test_acc")),
        "effective_training_time": round(effective_training_time(rows, len(replicas)), 4),
        "commits": len(leader_rows(rows, "commit")), "retries": len(leader_rows(rows, "retry")),
        "exactly_once": not once, "bitwise_identical": identical, "problems": once + problems + differing,
        "samples_seen": max(samples_by_step(rows, batch_rows).values(), default=0),
        "history": walked,
    }


#: A diagnosed fault (hang, stall, slow, sdc) is found and its host evicted within this long.
DIAGNOSIS_BOUND_S = 30.0
#: the finding each diagnosed kind should produce
FINDING_OF = {"hang": "hang", "stall": "hang", "slow": "straggler", "sdc": "sdc"}


def diagnosis_of(injection: dict, diagnoses: list[dict], dry_run: bool = False) -> dict | None:
    """For a diagnosed fault: the first finding of its kind that named its host first, and the
    decision that evicted it (in dry-run: that would have)."""
    want = FINDING_OF.get(injection["kind"])
    if want is None:
        return None
    t0, host = injection["injected_at"], injection["host"]
    mine = sorted((d for d in diagnoses if d["kind"] == want and d["at"] >= t0 - 0.05 and d["hosts"][:1] == [host]),
                  key=lambda d: d["at"])
    acted = next((d for d in mine if d["action"] in ("evict", "dry_run") and d["action_host"] == host), None)
    first = mine[0] if mine else None
    # the first finding says when it was found; the acting one how sure the eviction was (an
    # earlier one may have been a two-replica tie, reported only, while a replica rejoined)
    return {"found": first is not None, "found_s": first and round(first["at"] - t0, 3),
            "finding": first and first["summary"], "confidence": (acted or first or {}).get("confidence"),
            "first_confidence": first and first["confidence"],
            "action": (acted or first or {}).get("action"), "action_reason": (acted or first or {}).get("action_reason"),
            "evicted": acted is not None and acted["action"] == ("dry_run" if dry_run else "evict")}


def build(*, settings: dict, main: dict, injections: list[dict], events: list[dict], wall_s: float,
          detection_bound_s: float, baseline: dict | None, baseline_wall_s: float | None,
          band: dict | None = None, loss_window: dict | None = None, diagnoses: list[dict] = (),
          sync: dict | None = None) -> dict:
    """report.json. `main` and `baseline` are `summary` results; the baseline ran to the same
    samples seen as the main run (`baseline_steps_for`) in the same mode, so their difference
    is quality lost, not time lost. `band` is `band_view`; `loss_window` the two runs' mean
    training loss near the main run's last samples; `diagnoses` the controller's findings;
    `sync` the mode the replicas met in (mode, every_steps, text; default: every step)."""
    dry = bool(settings.get("diagnosis_dry_run"))
    landings = main.get("landings") or [None] * len(injections)
    failures = [{**i, **recovery(i, events), "diagnosis": diagnosis_of(i, list(diagnoses), dry),
                 "detection_bound_s": DIAGNOSIS_BOUND_S if i["kind"] in FINDING_OF else detection_bound_s,
                 "landed": land and land["text"], "lost_batches": land and land["lost_batches"]}
                for i, land in zip(injections, landings)]
    # in dry-run a diagnosed host is only reported: its replica neither dies nor rejoins
    recovering = [f for f in failures if not (dry and f["diagnosis"] is not None)]
    detected = [f["detection_s"] for f in recovering]
    diagnosed = [f["diagnosis"] for f in failures if f["diagnosis"] is not None]
    # a host evicted before its fault was injected was healthy then (and its fault never fires)
    bad_since = {i["host"]: i["injected_at"] for i in injections if i.get("host")}
    wrong = [d for d in diagnoses if d["action"] == "evict"
             and d.get("decided_at", d["at"]) < bad_since.get(d["action_host"], float("inf")) - 0.05]
    report = {
        "sync": sync or {"mode": "sync", "every_steps": 1, "text": "sync (gradients averaged every step)"},
        "settings": settings, "wall_s": round(wall_s, 2), "steps": main["steps"],
        "failures": failures, "effective_training_time": main["effective_training_time"],
        "final": {"train_loss": main["final_train_loss"], "test_loss": main["test_loss"],
                  "test_accuracy": main["test_accuracy"]},
        "commits": main["commits"], "retries": main["retries"],
        "checks": {
            "exactly_once": main["exactly_once"], "bitwise_identical": main["bitwise_identical"],
            "all_failures_detected": all(d is not None for d in detected),
            "detection_within_bound": all(f["detection_s"] is not None and 0 < f["detection_s"] <= f["detection_bound_s"]
                                          for f in recovering),
            "all_failures_rejoined": all(f["rejoin_s"] is not None for f in recovering),
            "identical_after_every_commit": main.get("identical_after_every_commit", True),
            "lost_batches_served_again": all(land["served_again"] for land in landings if land),
        },
        "diagnoses": list(diagnoses)[:50],
        "problems": main["problems"], "baseline": None, "accuracy_difference": None,
        "samples_seen": main["samples_seen"], "comparison": None, "history": main.get("history"),
    }
    if diagnosed:  # hosts that went bad: found by the diagnosis, and evicted (nobody else)
        report["checks"].update({"faults_found_on_their_host": all(d["found"] for d in diagnosed),
                                 "faulty_hosts_evicted": all(d["evicted"] for d in diagnosed),
                                 "no_healthy_host_evicted": not wrong})
    if baseline is not None:
        report["baseline"] = {k: baseline[k] for k in ("steps", "final_train_loss", "test_loss", "test_accuracy",
                                                       "effective_training_time", "exactly_once",
                                                       "bitwise_identical", "samples_seen")}
        report["baseline"]["wall_s"] = round(baseline_wall_s or 0.0, 2)
        if main["test_accuracy"] is not None and baseline["test_accuracy"] is not None:
            report["accuracy_difference"] = round(main["test_accuracy"] - baseline["test_accuracy"], 5)
        report["comparison"] = _comparison(report["accuracy_difference"], main, baseline, band, loss_window)
    return report


def _comparison(difference: float | None, main: dict, baseline: dict, band: dict | None,
                loss_window: dict | None) -> dict:
    spread = band["test_accuracy_spread"] if band else None
    out = {"basis": "equal samples seen", "samples_seen": main["samples_seen"],
           "baseline_samples_seen": baseline["samples_seen"], "test_accuracy_difference": difference,
           "baseline_seed_band": band,
           "difference_within_band": None if difference is None or spread is None else abs(difference) <= spread,
           "train_loss_near_end": loss_window}
    accuracy = main["test_accuracy"]
    if accuracy is not None and band:  # where the run itself falls among the baseline's seeds
        out["run_within_band_range"] = band["test_accuracy_min"] <= accuracy <= band["test_accuracy_max"]
    if difference is not None and band:
        where = ("inside" if out["run_within_band_range"] else
                 "below" if accuracy < band["test_accuracy_min"] else "above")
        out["statement"] = (
            f"at {main['samples_seen']} samples seen (baseline {baseline['samples_seen']}), test accuracy "
            f"differs by {difference:+.4f}; the baseline's seed-to-seed band is {spread:.4f} "
            f"({band['test_accuracy_min']:.4f}..{band['test_accuracy_max']:.4f} over seeds "
            f"{', '.join(map(str, band['seeds']))}{'' if band['applies'] else ', measured for another configuration'}"
            f"); the run's {accuracy:.4f} is {where} that range")
    return out


def passed(report: dict) -> bool:
    return all(report["checks"].values())

"""`fthsdp status --url URL`: the controller's REST picture as tables for operators."""

from __future__ import annotations

import argparse
import os
import sys

from protos import cli_flags as flags

ENV_READ_TOKEN = "FTHSDP_READ_TOKEN"


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def step_text(step) -> str:
    """A step number as the views show it: -1 (nothing committed) reads "none yet"."""
    return "none yet" if isinstance(step, int) and step < 0 else str(step)


def job_line(job: dict) -> str:
    """The job's first line: its id quoted (a job named "job" reads `job "job" RUNNING`), its
    state (FAILING while no replica can make progress), the quorum and the step it trains."""
    state = job["job_state"]
    if state == "RUNNING" and job.get("failing"):
        state = f"FAILING (FAILED in {job['fails_in_s']:.0f}s)"
    quorum = (f"quorum {job['quorum_id']} trains step {job['max_step']}  lr_scale {job['lr_scale']:.3f}"
              if job["quorum_id"] else "no quorum yet")
    return f'job "{job["job_id"]}" {state}  leader {job["leader"] or "?"}  {quorum}{_sync(job)}'


def _goodput_line(job: dict) -> list[str]:
    """The live goodput of /api/v1/job (absent from older controllers, off with --no-telemetry)."""
    g = job.get("goodput")
    if not g or not job.get("telemetry", True):
        return []
    return [f"committed step {step_text(job.get('committed_step', '?'))}  effective training time "
            f"{g['effective_training_ratio']:.1%} over {g['wall_s']:.0f}s  {g['committed_steps_per_s']:.2f} steps/s"]


def _sync(job: dict) -> str:
    """The job's sync mode, when replicas do not meet every step (absent from older controllers)."""
    mode, fragments = job.get("sync_mode", "sync"), job.get("sync_fragments", 1)
    if mode == "sync":
        return ""
    return f"  sync {mode} every {job.get('sync_every_steps', '?')} inner steps" + \
        (f" in {fragments} fragments" if fragments > 1 else "")


def render(job: dict, replicas: list, hosts: list, quorums: dict, events: list) -> str:
    known = job.get("replicas_known", len(replicas))
    unseen = f" ({job['replicas_total'] - known} not seen yet)" if known < job["replicas_total"] else ""
    out = [
        job_line(job),
        f"replicas {job['replicas_healthy']} healthy / {job['replicas_behind']} behind / "
        f"{job.get('replicas_joining', 0)} joining / {job['replicas_diverged']} diverged / "
        f"{job['replicas_finished']} finished / {job['replicas_dead']} dead of {job['replicas_total']}{unseen}  "
        f"spares free {job['spares_free']}  swaps {job['swaps']}  "
        f"replica commits {job.get('replica_commits', job['steps_committed'])}  digest mismatches {job['digest_mismatches']}",
        *_goodput_line(job),
        *([f"{'FAILING' if job.get('failing') else job['job_state']}: {job['job_state_reason']}"]
          if job.get("job_state_reason") else []),
        f"round: {job['round']['reason']}",
        "",
        table(["REPLICA", "STATE", "NEXT STEP", "COMMITTED", "LOSS", "DIGEST", "SEEN(s)", "REASON"],
              [[r["replica_id"], r["state"], r["step"], step_text(r["committed_step"]),
                None if r["last_loss"] is None else f"{r['last_loss']:.4g}",
                f"{r['digest'][:12]}@{r['digest_step']}" if r["digest"] else None,
                r["seconds_since_seen"], r["reason"]]
               for r in replicas]),
    ]
    if hosts:
        out += ["", table(["HOST", "STATE", "ASSIGNMENT", "ZONE", "CORDON", "SEEN(s)"],
                          [[h["host_id"], h["state"],
                            f"{h['assignment']['replica_id']}:{','.join(map(str, h['assignment']['ranks']))}"
                            if h["assignment"] else None,
                            h["labels"].get("zone"), h["cordon_reason"] if h["cordoned"] else None,
                            h["seconds_since_seen"]] for h in hosts])]
    current = quorums.get("current")
    if current:
        states = {r["replica_id"]: r["state"] for r in replicas}
        members = ", ".join(m["replica_id"] + ("" if m["healthy"] else "(diverged)" if states.get(m["replica_id"]) ==
                                               "DIVERGED" else "(behind)") for m in current["members"])
        out += ["", f"quorum {current['quorum_id']}: {members} — {current['reason']}"]
    if events:
        out += ["", "recent events:"] + [f"  {e['message']}" for e in events]
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fthsdp status", description=__doc__.split("\n\n")[0],
                                formatter_class=flags.DefaultsFormatter)
    flags.add_version(p)
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the controller's REST address")
    p.add_argument("--events", type=int, default=10, help="how many recent events to show")
    p.add_argument("--token-file", type=flags.existing_file,
                   help=f"file with a read token (default: env {ENV_READ_TOKEN}, else none)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="how long each request to the controller may take")
    return p


def main(argv: list[str]) -> int:
    import httpx

    p = parser()
    args = p.parse_args(argv)
    token = open(args.token_file).read().strip() if args.token_file else os.environ.get(ENV_READ_TOKEN)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=args.timeout_s) as http:
            parts = {}
            for name, path in (("job", "/api/v1/job"), ("replicas", "/api/v1/replicas"), ("hosts", "/api/v1/hosts"),
                               ("quorums", "/api/v1/quorums"), ("events", f"/api/v1/events?limit={max(args.events, 1)}")):
                reply = http.get(path)
                if reply.status_code != 200:
                    detail = reply.json().get("detail", reply.text) if reply.headers.get("content-type", "").endswith("json") else reply.text
                    print(f"fthsdp status: {path} answered {reply.status_code}: {detail}", file=sys.stderr)
                    return 1
                parts[name] = reply.json()
    except httpx.HTTPError as exc:
        print(f"fthsdp status: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.events == 0:
        parts["events"] = []
    print(render(**parts))
    return 0

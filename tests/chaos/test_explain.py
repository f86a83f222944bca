"""A chaos run's record explains itself (tests/chaos/explain.py): trainer tracebacks read from an
agent's log with what was raised and where, swaps and cordons with their reasons, and the
timeline of one run, in order. The log excerpts are shaped as the agents write them (a chained
traceback with torch's `[rank1]: ` prefix, as bench.chaos seed 21 logged it)."""

from __future__ import annotations

from datetime import datetime

from tests.chaos.executor import Injection, Recorded
from tests.chaos.explain import swaps, timeline, trainer_errors

CHAINED = """\
2026-12-07 08:42:16,285 agent[h0] INFO host h0: order o1 CURRENT (the current assignment of a (re)connecting host)
[h0 r0/0] 2026-12-07 08:42:17,001 trainer r0/0 WARNING replica r0: step 4 will be retried: rank 1 voted no
[h0 r0/1] [rank1]: Traceback (most recent call last):
[h0 r0/1] [rank1]:   File "/work/x/fthsdp/manager.py", line 417, in _pump
[h0 r0/1] [rank1]:     frame = self.client.receive(timeout)
[h0 r0/1] [rank1]:             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[h0 r0/1] [rank1]:   File "/work/x/fthsdp/step/client.py", line 158, in receive
[h0 r0/1] [rank1]:     raise ChannelError(f"rank {self.rank}: the coordinator closed the connection")
[h0 r0/1] [rank1]: fthsdp.errors.ChannelError: rank 1: the coordinator at 127.0.0.1:11123 closed the connection
[h0 r0/1] 
[h0 r0/1] [rank1]: During handling of the above exception, another exception occurred:
[h0 r0/1] 
[h0 r0/1] [rank1]: Traceback (most recent call last):
[h0 r0/1] [rank1]:   File "<frozen runpy>", line 198, in _run_module_as_main
[h0 r0/1] [rank1]:   File "/work/x/fthsdp/demo/trainer.py", line 217, in main
[h0 r0/1] [rank1]:     x, y = next(batches)
[h0 r0/1] [rank1]:   File "/work/x/fthsdp/manager.py", line 400, in _feed
[h0 r0/1] [rank1]:     raise error(effect.message)
[h0 r0/1] [rank1]: fthsdp.errors.Fatal: rank 1 lost its coordinator (rank 0); exit so the replica is restarted
2026-12-07 08:42:18,587 agent[h0] WARNING replica r0 rank 0: trainer was killed by signal 9; its replica waits
2026-12-07 08:42:18,588 agent[h0] INFO replica r0 rank 1: stopping pid 31599: another rank of its replica died
[h2 r2/0] Traceback (most recent call last):
[h2 r2/0]   File "/usr/lib/python3.12/socket.py", line 836, in create_connection
[h2 r2/0]     sock.connect(sa)
[h2 r2/0] OSError: [Errno 113] No route to host
[h0 r0/0] 2026-12-07 08:42:30,000 trainer r0/0 WARNING replica r0: step 9 will be retried
"""


def _t(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_chained_traceback_gives_what_was_raised_where_and_what_it_was_handling():
    chained, plain = trainer_errors(CHAINED, "h0")
    assert chained.trainer == "r0/1" and chained.host == "h0"
    assert chained.text == "fthsdp.errors.Fatal: rank 1 lost its coordinator (rank 0); exit so the replica is restarted"
    assert chained.where == "fthsdp/manager.py:400 in _feed"
    assert chained.cause == ("fthsdp.errors.ChannelError: rank 1: the coordinator at 127.0.0.1:11123 closed the "
                             "connection at fthsdp/step/client.py:158 in receive")
    # the agent's next word on that trainer gives its time (rank 0's line is about another trainer)
    assert chained.ended == "stopping pid 31599: another rank of its replica died"
    assert chained.at == _t("2026-12-07 08:42:18,588")
    # no prefix, no agent line after it: the last stamped line before it gives its time
    assert plain.trainer == "r2/0" and plain.text == "OSError: [Errno 113] No route to host"
    assert plain.where == "/usr/lib/python3.12/socket.py:836 in create_connection" and plain.cause == ""
    assert plain.ended == "" and plain.at == _t("2026-12-07 08:42:18,588")


def test_a_log_without_tracebacks_has_no_errors_and_a_cut_off_one_still_counts():
    warnings_only = "\n".join(line for line in CHAINED.splitlines() if "WARNING" in line or "INFO" in line)
    assert trainer_errors(warnings_only, "h0") == []
    torch = ("[h1 r1/0] Traceback (most recent call last):\n"
             "[h1 r1/0]   File \"/w/fthsdp/sync/gradients.py\", line 40, in reduce\n"
             "[h1 r1/0]   File \"/w/.venv/lib/python3.11/site-packages/torch/distributed/c10d.py\", line 9, in wait\n"
             "[h1 r1/0] RuntimeError: Connection reset by peer")
    (err,) = trainer_errors(torch, "h1")
    assert (err.where, err.called_from) == ("torch/distributed/c10d.py:9 in wait", "fthsdp/sync/gradients.py:40 in reduce")
    cut = "[h1 r1/0] Traceback (most recent call last):\n[h1 r1/0]   File \"/a/fthsdp/x.py\", line 3, in f\n" \
          "[h1 r1/0] RuntimeError: boom"
    (err,) = trainer_errors(cut, "h1")
    assert (err.text, err.where, err.at) == ("RuntimeError: boom", "fthsdp/x.py:3 in f", None)
    # the same trainer label crashing twice (a restart between): two errors, not one chain
    again = cut + "\n" + cut.replace("line 3", "line 9").replace("boom", "again")
    assert [(e.text, e.where, e.cause) for e in trainer_errors(again, "h1")] == [
        ("RuntimeError: boom", "fthsdp/x.py:3 in f", ""), ("RuntimeError: again", "fthsdp/x.py:9 in f", "")]


def test_swaps_and_cordons_keep_their_reasons_and_the_timeline_tells_the_run_in_order():
    t0 = 1000.0
    events = [
        {"at": t0 + 5.0, "kind": "quorum", "subject": "", "cause": "", "message": "quorum 3 formed"},
        {"at": t0 + 6.1, "kind": "host_death", "subject": "h2", "cause": "heartbeat",
         "message": "host h2 died: agent silent for 3.2s (limit 3s)"},
        {"at": t0 + 6.1, "kind": "cordon", "subject": "h2", "cause": "",
         "message": "host h2 cordoned: agent silent for 3.2s (limit 3s)"},
        {"at": t0 + 6.2, "kind": "swap", "subject": "h2", "cause": "",
         "message": "host spare0 takes replica r2 ranks 0,1 from host h2 (spare spare0 is the first free one): "
                    "agent silent for 3.2s (limit 3s)"},
        {"at": t0 + 9.0, "kind": "replica", "subject": "r2", "cause": "", "message": "replica r2 became HEALTHY"},
        {"at": t0 + 9.5, "kind": "replica", "subject": "r2", "cause": "", "message": "replica r2 became JOINING"},
    ]
    inj = Injection("kill_host", "kill_host:r2", t0 + 3.0, 4, ["r2"], ["h2"], ["SIGKILL host h2: 3 process(es)"],
                    done_at=t0 + 3.0, settled_at=t0 + 9.2)
    rec = Recorded(1, [], events, [inj], [], True, t0, t0 + 20.0)
    (err,) = trainer_errors(CHAINED, "h0")[1:]
    err = type(err)(t0 + 7.0, "spare0", "r2/0", err.text, err.where, called_from="fthsdp/x.py:3 in dial")

    assert [(s["kind"], s["host"]) for s in swaps(events)] == [("cordon", "h2"), ("swap", "h2")]
    assert "agent silent" in swaps(events)[1]["reason"]
    lines = timeline(rec, [err])
    assert lines == [
        "+3.0s fault kill_host:r2: SIGKILL host h2: 3 process(es)",
        "+6.1s host_death [heartbeat]: host h2 died: agent silent for 3.2s (limit 3s)",
        "+6.1s cordon: host h2 cordoned: agent silent for 3.2s (limit 3s)",
        "+6.2s swap: host spare0 takes replica r2 ranks 0,1 from host h2 (spare spare0 is the first free one): "
        "agent silent for 3.2s (limit 3s)",
        "+7.0s trainer error spare0 r2/0: OSError: [Errno 113] No route to host at "
        "/usr/lib/python3.12/socket.py:836 in create_connection (called from fthsdp/x.py:3 in dial)",
        "+9.0s replica: replica r2 became HEALTHY",
        "+9.2s fault kill_host:r2 settled: every replica HEALTHY again",
    ]

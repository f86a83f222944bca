"""One replica of bench.semisync: a user's training script, on fthsdp or on torchft.

Both train the same model (an MLP seeded by the run's seed) on the same data (a fixed random
teacher network; replica r's batch at position p is a function of the seed, r and p only) for
the same inner steps with the same inner optimizer (AdamW, fused with --inner-optimizer adamw_fused) and, for DiLoCo, the same outer one
(SGD, lr 0.7, momentum 0.9, Nesterov: fthsdp's defaults and the DiLoCo paper's). Each prints
one JSON line: the bytes its FTAR endpoint sent (fthsdp only), when each sync committed (and
after how many inner steps), the inner steps it trained and the final model's held-out loss.

- `fthsdp_worker`: `Manager` + `FaultTolerantOptimizer`, the settings a user's script reads
  (FTHSDP_SYNC_* from the environment: bench.semisync sets FTHSDP_SYNC_FRAGMENTS for F > 1 and
  FTHSDP_SYNC_WIRE_DTYPE for --wire-dtype bfloat16, FTHSDP_SYNC_OVERLAP_STEPS for --overlap-steps);
  it reports the wire dtype and the overlap its settings hold, and where its time went. The
  held-out loss is the model's after Manager.close(), which in streaming_diloco loads the
  global copy of every fragment.
- `torchft_worker`: torchft's `Manager` over its `ProcessGroupGloo` and `torchft.local_sgd.DiLoCo`
  wrapping the inner optimizer, as torchft's own DiLoCo tests do; its own TCPStore (the
  replica group's, world size 1) and the lighthouse bench.semisync started.
"""

from __future__ import annotations

import time
from dataclasses import replace

OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # fthsdp's defaults (RuntimeSettings.outer_lr / outer_momentum)
HELDOUT_REPLICA = "999"  # held-out samples come from a replica id no run trains on


def model_and_data(cfg: dict):
    """(model, inner optimizer, batch_at(replica, position, rows=None) -> (x, y)); torch on
    cfg["threads"] threads (the replicas share the machine's cores: more oversubscribe them)."""
    import torch

    torch.set_num_threads(cfg["threads"])

    torch.manual_seed(10_007)  # the teacher: the same on every replica and in every run
    teacher = torch.nn.Sequential(torch.nn.Linear(cfg["features"], 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def batch_at(replica: str, position: int, rows: int | None = None):
        g = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + int(replica) * 100_003 + position)
        x = torch.randn(rows or cfg["batch_size"], cfg["features"], generator=g)
        with torch.no_grad():
            return x, teacher(x) + 0.05 * torch.randn(x.shape[0], 1, generator=g)

    torch.manual_seed(cfg["seed"])
    f, hidden = cfg["features"], cfg["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(f, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.GELU(), torch.nn.Linear(hidden, 1))
    fused = cfg.get("inner_optimizer") == "adamw_fused"
    return model, torch.optim.AdamW(model.parameters(), lr=cfg["lr"], fused=fused), batch_at


def _result(model, batch_at, cfg: dict, commits: list[tuple[float, int]], inner_steps: int, **more) -> dict:
    import torch

    hx, hy = batch_at(HELDOUT_REPLICA, 0, cfg["heldout"])
    with torch.no_grad():
        heldout = torch.nn.functional.mse_loss(model(hx), hy).item()
    return {"commits": len(commits), "commit_times": commits, "inner_steps": inner_steps, "heldout_loss": heldout,
            "params": sum(p.numel() for p in model.parameters()), **more}


def fthsdp_worker(cfg: dict) -> dict:
    import torch

    from bench.semisync_link import Pacer, paced_transport
    from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings, Seams
    from ftar_kernels import FtarEndpoint

    pacer = Pacer(cfg["bucket_bytes_s"])  # 0 on the veth link: it only counts

    def paced(ep: FtarEndpoint) -> FtarEndpoint:
        host = ep.address.rpartition(":")[0]
        ep.close()
        return FtarEndpoint.open(host, 0, ep.settings, transport=paced_transport(pacer, ep.settings.socket_buffer_bytes))

    model, opt, batch_at = model_and_data(cfg)
    settings = RuntimeSettings.from_env(
        job_id="semisync", replica_id=cfg["replica_id"], controller_address=cfg["controller"],
        bind_host=cfg["host"], sync_mode=cfg["mode"], sync_every_steps=cfg["sync_every"],
        quorum_timeout_s=120.0, gather_timeout_s=120.0, allreduce_timeout_s=120.0, digest_every_steps=0)
    # max_steps counts syncs: one per H inner steps, or per H/F with streaming_diloco's F fragments
    settings = replace(settings, max_steps=cfg["steps"] // settings.inner_steps_per_sync)
    manager = Manager(model, opt, settings, seams=Seams(endpoint=paced)).start()
    ft = FaultTolerantOptimizer(manager, opt)
    commits: list[tuple[float, int]] = []
    inner = 0
    # where the time goes: inside the runtime at a sync's due step (the wait for its quorum,
    # all-reduce and decision, and the commit), at the other steps' begin/end, and in the script
    spent = {"sync_s": 0.0, "runtime_s": 0.0, "compute_s": 0.0}
    batches = manager.batches(batch_at)
    while True:
        t0 = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            break
        step = manager.step
        t1 = time.perf_counter()
        ft.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        t2 = time.perf_counter()
        ft.step()
        t3 = time.perf_counter()
        inner += 1
        spent["compute_s"] += t2 - t1
        if manager.step != step:
            commits.append((t3, inner))
            spent["sync_s"] += t3 - t2
            spent["runtime_s"] += t1 - t0
        else:
            spent["runtime_s"] += t1 - t0 + t3 - t2
    manager.close()  # streaming_diloco: the model takes the global copy of every fragment
    return _result(model, batch_at, cfg, commits, inner, bytes_sent=pacer.sent,
                   wire_dtype=settings.sync_wire_dtype,  # what the runtime used
                   overlap_steps=settings.overlap_steps, plan_ahead_steps=settings.sync_plan_ahead_steps,
                   syncs_begun_ahead=manager.syncs_begun_ahead, plans_in_at_due=manager.plans_in_at_due, **spent)


def torchft_worker(cfg: dict) -> dict:
    from datetime import timedelta

    import torch
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    model, inner_opt, batch_at = model_and_data(cfg)
    outer_opt = torch.optim.SGD(model.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
    timeout = timedelta(seconds=120)
    host = cfg["host"]
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False)  # the replica group's (torchrun's role)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=cfg["replicas"], use_async_quorum=False,
        load_state_dict=model.load_state_dict, state_dict=model.state_dict, replica_id=cfg["replica_id"],
        store_addr=host, store_port=store.port, rank=0, world_size=1, lighthouse_addr=cfg["lighthouse"],
        hostname=host, timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
        init_sync=False)  # every replica starts from the same seeded weights, as fthsdp's do
    commits: list[tuple[float, int]] = []
    try:
        with DiLoCo(manager, [model], inner_opt, outer_opt, sync_every=cfg["sync_every"]):
            for position in range(cfg["steps"]):
                x, y = batch_at(cfg["replica_id"], position)
                step = manager.current_step()
                inner_opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                inner_opt.step()  # DiLoCo's hook syncs after every H-th
                if manager.current_step() != step:
                    commits.append((time.perf_counter(), position + 1))
    finally:
        manager.shutdown(wait=False)
    return _result(model, batch_at, cfg, commits, cfg["steps"])


WORKERS = {"fthsdp": fthsdp_worker, "torchft": torchft_worker}

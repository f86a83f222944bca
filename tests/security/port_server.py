"""One trainer port in a process of its own, for the attacks in tests/security/test_trainer_*.py.

    python -m tests.security.port_server coordinator|state CONFIG_JSON

The job secret comes from the environment (as the agent hands it to a trainer). Prints one JSON
line with the port's address and this pid, then answers one JSON line per command on stdin:
`stats` (threads, connections and what the port counted), `reset` (coordinator: a fresh one on
a new port; `reset SECONDS` with that hello timeout), `stop SECONDS` (state server: hold for the fetcher "b" that long, then stop
serving; the answer comes when stop returned), `serve N` (state server: serve step N). stdin closing ends the process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading

from protos import job_secret


def _coordinator(cfg: dict):
    """A replica coordinator; `reset` replaces it by a fresh one (a new replica: CONNECTING again).
    Its controller is the at-scale simulation's stand-in, which answers every quorum at once: the
    attacks are on the coordinator's port, not on the controller."""
    from bench.channel_simulation import InstantController
    from fthsdp.settings import RuntimeSettings
    from fthsdp.step.coordinator import CoordinatorService

    settings = RuntimeSettings(job_id=cfg["job_id"], replica_id="r0", world_size=cfg["world_size"],
                               controller_address="127.0.0.1:1", coordinator_address="127.0.0.1:0",
                               quorum_timeout_s=30.0, gather_timeout_s=10.0, allreduce_timeout_s=10.0,
                               hello_timeout_s=cfg["hello_timeout_s"],
                               digest_every_steps=0, job_secret=job_secret.from_env())
    services = [CoordinatorService(settings, InstantController(), "127.0.0.1", 0).start()]

    def stats(_args: list[str]) -> dict:
        svc = services[-1]
        return {"threads": threading.active_count(), "connections": len(svc._connections),
                "unauthenticated": len(svc._unauthenticated), "stage": svc.stage.name}

    def reset(args: list[str]) -> dict:
        services.pop().close(linger_s=0.1)
        fresh = dataclasses.replace(settings, hello_timeout_s=float(args[0])) if args else settings
        services.append(CoordinatorService(fresh, InstantController(), "127.0.0.1", 0).start())
        return {"address": services[-1].address}

    return services[0].address, {"stats": stats, "reset": reset}, lambda: services[-1].close(linger_s=0.1)


def _state(cfg: dict):
    """A state server of one tensor of `state_bytes` (torch.randn under `seed`, 0 unless given),
    serving a step to the fetcher "b"; `serve N` serves step N (the state does not change: only
    its step number). `"insecure": true`: a stranger's server, without the job secret."""
    import torch

    from fthsdp.state.serve import StateServer
    from fthsdp.state.stream import build_manifest, live_entries

    torch.manual_seed(cfg.get("seed", 0))
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.randn(cfg["state_bytes"] // 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    served = [5]

    def snapshot():
        entries, scalars = live_entries(model, opt)
        return build_manifest(served[0], '{"positions": {"b": 3}}', entries, scalars,
                              opt.state_dict()["param_groups"]), [t for _, t in entries]

    key = None if cfg.get("insecure") else job_secret.from_env().key(job_secret.PURPOSE_STATE)
    server = StateServer("127.0.0.1", 0, snapshot, "attacked", key=key,
                         hello_timeout_s=cfg["hello_timeout_s"], io_timeout_s=cfg["hello_timeout_s"]).start()
    server.serve(served[0], ("b",))

    def stats(_args: list[str]) -> dict:
        return {"threads": threading.active_count(), "connections": server.connections,
                "refused": server.refused_requests, "accepted": server.fetches_accepted,
                "acks": sorted(server._acks.get(served[0], ())), "admitted": server._httpd.admitted,
                "turned_away": server._httpd.turned_away, "busy": server._httpd.busy, "timed_out": server._httpd.timed_out,
                "unauthenticated": server._httpd.unauthenticated_connections}

    def serve(args: list[str]) -> dict:
        served[0] = int(args[0])
        server.serve(served[0], ("b",))
        return {"step": served[0]}

    def stop(args: list[str]) -> dict:
        return {"missing": sorted(server.stop(("b",), float(args[0])))}

    return server.address, {"stats": stats, "serve": serve, "stop": stop}, server.close


def main(kind: str, cfg: dict) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    address, commands, close = {"coordinator": _coordinator, "state": _state}[kind](cfg)
    print(json.dumps({"address": address, "pid": os.getpid()}), flush=True)
    try:
        for line in sys.stdin:
            name, *args = line.split()
            print(json.dumps(commands[name](args)), flush=True)
    finally:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))

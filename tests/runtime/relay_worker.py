"""A relay rank's relay service alone, as its own process (no Manager, no torch), so a test can
SIGKILL it. Prints the relay's address once it reached the coordinator, then relays until its
stdin closes.

    python -m tests.runtime.relay_worker '{"rank": 3, "world_size": 9, "relay_fanout": 3, "coordinator": "h:p"}'
"""

from __future__ import annotations

import json
import logging
import sys

from fthsdp.settings import RuntimeSettings
from fthsdp.step.relay import RelayService


def main() -> None:
    cfg = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s relay {cfg['rank']} %(name)s: %(message)s")
    settings = RuntimeSettings.from_env(job_id=cfg.get("job_id", "relays"), replica_id=cfg.get("replica_id", "r0"),
                                        rank=cfg["rank"], world_size=cfg["world_size"],
                                        relay_fanout=cfg["relay_fanout"], coordinator_address=cfg["coordinator"],
                                        quorum_timeout_s=20.0, hello_timeout_s=5.0,
                                        gather_timeout_s=cfg.get("gather_timeout_s", 60.0),
                                        allreduce_timeout_s=cfg.get("gather_timeout_s", 60.0))  # relays reduce nothing
    relay = RelayService(settings, cfg["coordinator"], "127.0.0.1", incarnation=f"relay-{cfg['rank']}").start()
    print(relay.address, flush=True)
    sys.stdin.read()  # until the test closes it
    relay.close(linger_s=1.0)


if __name__ == "__main__":
    main()

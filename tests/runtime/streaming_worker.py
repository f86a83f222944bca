"""One trainer process of tests/runtime/test_cluster_streaming.py: tests/runtime/semisync_worker.py's
trainer, loop and records, with the model synced in config["fragments"] fragments
(streaming_diloco), the pseudo-gradient on the wire in config["wire"] and each fragment's sync
overlapping config["overlap"] inner steps -- set as a user sets them, through
FTHSDP_SYNC_FRAGMENTS, FTHSDP_SYNC_WIRE_DTYPE and FTHSDP_SYNC_OVERLAP_STEPS. Its commit rows say
"batches": H (the worker's sync_every); a streaming sync commits H / F of them per contributor,
which the test reads back."""

from __future__ import annotations

import json
import os
import sys

from fthsdp.settings import ENV_SYNC_FRAGMENTS, ENV_SYNC_OVERLAP_STEPS, ENV_SYNC_WIRE_DTYPE
from tests.runtime import semisync_worker

if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    os.environ[ENV_SYNC_FRAGMENTS] = str(cfg["fragments"])
    os.environ[ENV_SYNC_WIRE_DTYPE] = cfg.get("wire", "float32")
    if "overlap" in cfg:
        os.environ[ENV_SYNC_OVERLAP_STEPS] = str(cfg["overlap"])
    sys.exit(semisync_worker.main(cfg))

"""A trainer's start: `import fthsdp` loads none of torch's heavy distributed packages.

A restarted trainer's imports are part of every recovery's downtime. DCP
(`torch.distributed.checkpoint`), FSDP2 (`torch.distributed.fsdp`) and DTensor
(`torch.distributed.tensor`) are together about half of what `import fthsdp` took; fthsdp
imports them when a checkpoint is first written or read, and otherwise finds them in
`sys.modules` once the training script imported them (no model can be wrapped by FSDP2, and no
tensor be a DTensor, before that).
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch.distributed.checkpoint", "torch.distributed.fsdp", "torch.distributed.tensor")


def _loaded_after(code: str) -> dict[str, bool]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_importing_fthsdp_and_building_a_manager_loads_no_heavy_distributed_package():
    loaded = _loaded_after("import fthsdp\nfrom fthsdp import Manager, RuntimeSettings, state_digest\n"
                           "import fthsdp.manager, fthsdp.state.checkpoint, fthsdp.sync.fsdp, fthsdp.state.shards")
    assert loaded == {m: False for m in HEAVY}, loaded


def test_the_probe_sees_a_heavy_package_once_the_script_imports_it():
    # The check above could pass by reading the wrong process: here the same probe must see FSDP2.
    loaded = _loaded_after("import fthsdp\nfrom torch.distributed.fsdp import fully_shard")
    assert loaded["torch.distributed.fsdp"] and loaded["torch.distributed.tensor"], loaded

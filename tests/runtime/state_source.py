"""A catch-up source for state-transfer tests: a real StateServer over a live model and optimizer
(and registered state), serving one step to the fetcher "b", authenticated with the tests' job
secret."""

from __future__ import annotations

from fthsdp.state.serve import StateServer
from fthsdp.state.stream import build_manifest, live_entries
from protos import job_secret
from tests.trainer_secret import SECRET

KEY = SECRET.key(job_secret.PURPOSE_STATE)


def live_snapshot(model, opt, step: int, ledger_json: str = "{}", registry=None):
    """What a StateServer serves: the live tensors, read anew at each request."""

    def snapshot():
        entries, scalars = live_entries(model, opt)
        if registry is not None:
            entries += registry.entries()
        groups = opt.state_dict()["param_groups"]
        return build_manifest(step, ledger_json, entries, scalars, groups), [t for _, t in entries]

    return snapshot


def serving(snapshot, step: int) -> StateServer:
    """A started server serving `step` of `snapshot` to "b" (close it)."""
    server = StateServer("127.0.0.1", 0, snapshot, label="test", key=KEY).start()
    server.serve(step, ("b",))
    return server

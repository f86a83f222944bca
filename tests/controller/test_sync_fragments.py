"""The controller's --sync-fragments (streaming_diloco): refused by name where it cannot hold."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("flags, why", [
    (("--sync-mode", "streaming_diloco", "--sync-every", "6", "--sync-fragments", "4"),
     "sync_fragments must be 1, or with sync_mode streaming_diloco a divisor of sync_every_steps (6), got 4"),
    (("--sync-mode", "diloco", "--sync-every", "8", "--sync-fragments", "2"),
     "sync_fragments must be 1, or with sync_mode streaming_diloco a divisor of sync_every_steps (8), got 2 with "
     "diloco"),
])
def test_the_controller_refuses_fragments_that_do_not_fit_the_mode(flags, why):
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "controller", "--replicas", "2", *flags,
                          "--grpc-port", "0", "--http-port", "0", "--insecure"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and why in out.stderr, out.stderr

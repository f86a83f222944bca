"""The controller's --sync-fragments (streaming_diloco): refused by name where it cannot hold."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("flags, why", [
    (("--sync-mode", "streaming_diloco", "--sync-every", "6", "--sync-fragments", "4"),
     "sync_every_steps=6 must be a multiple of sync_fragments=4"),
    (("--sync-mode", "diloco", "--sync-every", "8", "--sync-fragments", "2"),
     "sync_fragments=2 needs sync_mode streaming_diloco (got 'diloco')"),
])
def test_the_controller_refuses_fragments_that_do_not_fit_the_mode(flags, why):
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "controller", "--replicas", "2", *flags,
                          "--grpc-port", "0", "--http-port", "0", "--insecure"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and why in out.stderr, out.stderr

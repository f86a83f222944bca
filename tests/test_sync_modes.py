"""protos/sync_modes.py: the one rule for a mode, H and F that the controller's and the runtime's
settings both apply; each refusal names the bad value."""

import pytest

from controller.settings import ControllerSettings
from fthsdp.errors import InvalidSettings
from fthsdp.settings import RuntimeSettings
from protos.sync_modes import schedule_problems


@pytest.mark.parametrize("mode, every, fragments, says", [
    ("diloko", 8, 1, "sync_mode must be one of sync, local_sgd, diloco, streaming_diloco, got 'diloko'"),
    ("sync", 8, 1, "sync_every_steps=8 needs sync_mode local_sgd, diloco or streaming_diloco"),
    ("diloco", 0, 1, "sync_every_steps must be a number of inner steps >= 1, got 0"),
    ("diloco", True, 1, "sync_every_steps must be a number of inner steps >= 1, got True"),
    ("diloco", "8", 1, "sync_every_steps must be a number of inner steps >= 1, got '8'"),
    ("diloco", 8, 2, "sync_fragments=2 needs sync_mode streaming_diloco (got 'diloco')"),
    ("streaming_diloco", 6, 4, "sync_every_steps=6 must be a multiple of sync_fragments=4"),
    ("streaming_diloco", 8, -1, "sync_fragments must be a number of fragments >= 1, got -1"),
])
def test_a_schedule_that_cannot_hold_is_refused_alike_by_both_settings_naming_the_value(mode, every, fragments, says):
    assert any(says in p for p in schedule_problems(mode, every, fragments))
    with pytest.raises(ValueError) as controller:
        ControllerSettings(sync_mode=mode, sync_every_steps=every, sync_fragments=fragments).validate()
    with pytest.raises(InvalidSettings) as runtime:
        RuntimeSettings(replica_id="r0", controller_address="127.0.0.1:1", insecure_trainer_ports=True,
                        sync_mode=mode, sync_every_steps=every, sync_fragments=fragments).validate()
    assert says in str(controller.value) and says in str(runtime.value)


@pytest.mark.parametrize("mode, every, fragments", [("sync", 1, 1), ("local_sgd", 8, 1), ("diloco", 1, 1),
                                                     ("streaming_diloco", 8, 2), ("streaming_diloco", 8, 8)])
def test_a_schedule_that_holds_has_no_problem(mode, every, fragments):
    assert schedule_problems(mode, every, fragments) == []

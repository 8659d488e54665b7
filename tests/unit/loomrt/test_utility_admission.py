"""Registry.admit_utility: CPU utility requests (input-token counts) have their own bound per
deployment, one running plus `pending_capacity` waiting; beyond it QueueFull (503), and a
released slot admits again. The bound is the registry's, so the real `mini` package is enough."""

from __future__ import annotations

import pytest

from loomrt.devices import Devices
from loomrt.errors import QueueFull
from loomrt.registry import Registry
from mini_package import mini_document

TIMEOUT = 60


@pytest.fixture
def registry():
    reg = Registry(Devices(cuda={}))
    yield reg
    reg.close(timeout=TIMEOUT)


def test_the_count_queue_holds_one_running_plus_pending_capacity(registry, tmp_path):
    reg = registry.register(mini_document(tmp_path, model="m", pending_capacity=2))
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT) and reg.phase == "ready", reg.error
    for _ in range(3):
        registry.admit_utility(reg)
    with pytest.raises(QueueFull) as caught:
        registry.admit_utility(reg)
    assert caught.value.status == 503 and caught.value.code == "queue_full"
    assert "count queue is full" in caught.value.message
    registry.release_utility(reg)
    registry.admit_utility(reg)          # a released slot is free again
    with pytest.raises(QueueFull):
        registry.admit_utility(reg)

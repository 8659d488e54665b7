"""Stand-ins a service's scheduling tests share: residency that always has the (empty) params."""

from __future__ import annotations

from types import SimpleNamespace


class FakeResidency:
    def __init__(self):
        self.devices = SimpleNamespace(set=lambda *a: None)

    def acquire(self, component):
        return {}

    def release(self, component):
        pass

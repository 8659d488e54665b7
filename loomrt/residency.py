"""Parameter residency: which components' weights are on which device, loaded, pinned or evicted.

A `Component` is one independently resident set of params (a deployment's `primary`, and
`image` where declared). Its `load` callable runs the `prepare` program (once per
activation: after an eviction the next use prepares again). Loading charges the device;
when the device's total passes its budget, idle unpinned components are evicted least
recently used first; if that cannot make room, the load is undone and fails with
`DeviceMemoryExhausted` naming the numbers (what was evicted on its behalf stays evicted and
reloads on its next use). Budgets compare everything the device owns (params, state,
scratch), but only params are evictable. Services `acquire` a component around each step
(loading it on first use) and `release` it after, so a component in use is never evicted.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from loomrt.devices import Device, Devices
from loomrt.errors import DeviceMemoryExhausted

Params = dict[str, Any]


def param_arrays(params: Params) -> Iterator[Any]:
    """Every param array, a family's members one by one."""
    for value in params.values():
        yield from (value if isinstance(value, list) else [value])


def params_bytes(params: Params) -> int:
    return sum(int(np.asarray(array).nbytes) for array in param_arrays(params))


class Component:
    """One resident unit of params: `owner` is `model/component` in the device ledger."""

    def __init__(self, model: str, name: str, device: Device, load: Callable[[], Params]):
        self.model, self.name, self.device = model, name, device
        self.owner = f"{model}/{name}"
        self._load = load
        self.params: Params | None = None
        self.nbytes = 0
        self.pinned = False
        self.busy = 0
        self.last_used = 0
        self.loads = 0           # how many times `prepare` ran: once per activation
        self.loading = False
        self.retired = False

    @property
    def resident(self) -> bool:
        return self.params is not None

    def describe(self) -> dict[str, Any]:
        return {"component": self.name, "device": self.device.key, "resident": self.resident,
                "pinned": self.pinned, "bytes": self.nbytes, "in_use": self.busy > 0, "activations": self.loads}


class Residency:
    """Loads, evicts, pins and trims components against the device budgets."""

    def __init__(self, devices: Devices):
        self.devices = devices
        self._cond = threading.Condition()
        self._components: list[Component] = []
        self._clock = itertools.count(1)

    def add(self, component: Component) -> None:
        with self._cond:
            self._components.append(component)

    def retire(self, component: Component) -> None:
        """Forget a component and release its bytes (the registration is gone)."""
        with self._cond:
            component.retired = True
            if component in self._components:
                self._components.remove(component)
            self._drop(component)
            self._cond.notify_all()

    # ---- loading ---------------------------------------------------------------------------

    def load(self, component: Component) -> Params:
        """The component's params, preparing them now if they are not resident."""
        with self._cond:
            while component.loading:
                self._cond.wait()
            if component.params is not None:
                component.last_used = next(self._clock)
                return component.params
            component.loading = True
        try:
            params = component._load()       # outside the lock: preparation can take seconds
        except BaseException:
            with self._cond:
                component.loading = False
                self._cond.notify_all()
            raise
        with self._cond:
            component.loading = False
            self._cond.notify_all()
            if component.retired:
                return params
            component.params, component.nbytes, component.loads = params, params_bytes(params), component.loads + 1
            component.last_used = next(self._clock)
            self.devices.set(component.device.key, component.owner, "params", component.nbytes)
            self._fit(component)
            return params

    def acquire(self, component: Component) -> Params:
        """Params for one step: loaded if needed, and kept from eviction until `release`."""
        with self._cond:
            component.busy += 1
        try:
            return self.load(component)
        except BaseException:
            self.release(component)
            raise

    def release(self, component: Component) -> None:
        with self._cond:
            component.busy -= 1
            component.last_used = next(self._clock)
            self._cond.notify_all()

    # ---- eviction --------------------------------------------------------------------------

    def _drop(self, component: Component) -> None:
        # the device's accounting first: whoever sees the component not resident (it reads
        # `params` without this lock) then sees its bytes released too
        self.devices.set(component.device.key, component.owner, "params", 0)
        component.params, component.nbytes = None, 0

    def _eligible(self, device: Device, keep: Component | None = None) -> list[Component]:
        out = [c for c in self._components if c.device is device and c.resident and not c.pinned
               and c.busy == 0 and c is not keep]
        return sorted(out, key=lambda c: c.last_used)

    def _fit(self, loaded: Component) -> None:
        device = loaded.device
        while self.devices.used(device.key) > device.budget_bytes:
            victims = self._eligible(device, keep=loaded)
            if not victims:
                used, needed = self.devices.used(device.key), loaded.nbytes  # before the drop zeroes it
                self._drop(loaded)
                raise DeviceMemoryExhausted(
                    f"{loaded.owner} needs {needed} bytes of params on "
                    f"{device.name}: {used} bytes would be in use against a budget of {device.budget_bytes}, "
                    "and nothing else there is idle and unpinned")
            self._drop(victims[0])

    def evict(self, component: Component) -> None:
        """Deactivate: wait until no step uses the component, then release its params."""
        with self._cond:
            while component.busy > 0 or component.loading:
                self._cond.wait()
            self._drop(component)

    def trim(self, device: Device, target_bytes: int) -> None:
        """Evict idle unpinned components on `device`, LRU first, until it uses ≤ target_bytes."""
        with self._cond:
            for victim in self._eligible(device):
                if self.devices.used(device.key) <= target_bytes:
                    break
                self._drop(victim)

    def set_pinned(self, component: Component, pinned: bool) -> None:
        with self._cond:
            component.pinned = pinned


__all__ = ["Component", "Params", "Residency", "param_arrays", "params_bytes"]

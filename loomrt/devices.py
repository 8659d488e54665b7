"""Devices and their memory accounting: who owns how many bytes of what, against which budget.

`cpu` always exists. CUDA ordinals exist when CuPy is installed and sees a device; a
document naming one that does not exist fails its registration with that reason. Every
byte the runtime keeps for a deployment is charged here under an owner (`model/component`)
and a category (`params`, `state`, `scratch`, `snapshots`); the residency manager compares
a device's total with its budget to decide what to evict. The ledger only counts: it never
allocates, so a budget is a policy limit, not an allocator.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from loomrt.errors import InvalidRequest, NotFound

CATEGORIES = ("params", "state", "scratch", "snapshots")
DeviceKey = str | int


@dataclass
class Device:
    key: DeviceKey          # "cpu" or a CUDA ordinal
    name: str               # "cpu" or "cuda:N"
    target: str             # the loomc target its kernels compile for
    total_bytes: int        # physical memory as the system reports it
    budget_bytes: int       # what the runtime may keep resident on it


def _cpu_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - every Linux has these
        return 1 << 40


def cuda_devices() -> dict[int, int]:
    """Ordinal -> total bytes of each CUDA device CuPy sees; empty without CuPy or a GPU."""
    try:
        import cupy  # noqa: F401
        from cupy.cuda import runtime
        count = runtime.getDeviceCount()
    except Exception:  # CuPy missing, no driver, no device: all mean "no CUDA here"
        return {}
    out = {}
    for ordinal in range(count):  # pragma: no cover - needs a GPU
        out[ordinal] = int(runtime.getDeviceProperties(ordinal)["totalGlobalMem"])
    return out


def parse_device_key(value: Any) -> DeviceKey:
    """`"cpu"` or a non-negative ordinal (also as its decimal string, as CLI flags give it)."""
    if value == "cpu":
        return "cpu"
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidRequest(f"device: expected \"cpu\" or a device ordinal, got {value!r}", param="device")


class Devices:
    """The machine's devices and one ledger of owned bytes per device."""

    def __init__(self, budgets: dict[DeviceKey, int] | None = None, *, cuda: dict[int, int] | None = None):
        cuda = cuda_devices() if cuda is None else cuda
        self._devices: dict[DeviceKey, Device] = {"cpu": Device("cpu", "cpu", "cpu", _cpu_total(), _cpu_total())}
        for ordinal, total in cuda.items():
            self._devices[ordinal] = Device(ordinal, f"cuda:{ordinal}", "cuda", total, total)
        for key, budget in (budgets or {}).items():
            device = self.get(parse_device_key(key))
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
                raise InvalidRequest(f"device memory budget for {device.name} must be a non-negative integer")
            device.budget_bytes = budget
        self._lock = threading.Lock()
        self._owned: dict[DeviceKey, dict[tuple[str, str], int]] = {k: {} for k in self._devices}

    def get(self, key: DeviceKey) -> Device:
        device = self._devices.get(key)
        if device is None:
            if key == "cpu":  # pragma: no cover - cpu always exists
                raise AssertionError("no cpu device")
            have = ", ".join(d.name for d in self._devices.values())
            raise NotFound(f"device {key} is not available (this server has: {have}; CUDA devices need CuPy "
                           "and a visible GPU)", param="device")
        return device

    def all(self) -> list[Device]:
        return list(self._devices.values())

    # ---- the ledger ----------------------------------------------------------------------

    def set(self, key: DeviceKey, owner: str, category: str, nbytes: int) -> None:
        """Record that `owner` keeps `nbytes` of `category` on the device (0 removes the entry)."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}")
        with self._lock:
            ledger = self._owned[key]
            if nbytes:
                ledger[(owner, category)] = int(nbytes)
            else:
                ledger.pop((owner, category), None)

    def release_owner(self, owner: str) -> None:
        with self._lock:
            for ledger in self._owned.values():
                for entry in [e for e in ledger if e[0] == owner]:
                    del ledger[entry]

    def used(self, key: DeviceKey) -> int:
        with self._lock:
            return sum(self._owned[key].values())

    def accounting(self, key: DeviceKey | None = None) -> list[dict[str, Any]]:
        """Per device: total, budget, used, by category and by owner (what `trim` and status return)."""
        with self._lock:
            out = []
            for device in self._devices.values():
                if key is not None and device.key != key:
                    continue
                ledger = self._owned[device.key]
                by_category = {c: 0 for c in CATEGORIES}
                owners: dict[str, dict[str, int]] = {}
                for (owner, category), n in sorted(ledger.items()):
                    by_category[category] += n
                    owners.setdefault(owner, {})[category] = n
                out.append({"device": device.key, "name": device.name, "total_bytes": device.total_bytes,
                            "budget_bytes": device.budget_bytes, "used_bytes": sum(ledger.values()),
                            "categories": by_category, "owners": owners})
            return out


__all__ = ["CATEGORIES", "Device", "DeviceKey", "Devices", "cuda_devices", "parse_device_key"]

"""A bundled sample registered in process and ready, for the benchmarks that drive loomrt directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def ready_sample(name: str, timeout: float = 1200) -> tuple[Any, Any]:
    """(registry, registration) of `samples/NAME/model.json` once it is ready; exits if it fails."""
    from loomrt.devices import Devices
    from loomrt.registry import Registry

    registry = Registry(Devices(cuda={}))
    path = REPO / "samples" / name / "model.json"
    reg = registry.register(path.read_text(), origin=str(path))
    if not registry.wait_for(lambda: reg.phase in ("ready", "failed"), timeout) or reg.phase != "ready":
        registry.close()
        raise SystemExit(f"{name} did not become ready: {reg.error}")
    return registry, reg

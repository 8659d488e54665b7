"""Named checkpoints: immutable endpoints of a retained session, kept as host images of its KV pages.

One implementation for every kind that retains sessions (text histories, sequence handles):
the service finds the session and takes its image; `Pins` owns the rules every kind shares
(capacity, names, deletion while a request still forks from it). A checkpoint is a host
copy (elastic backing), so no live branch can change it and deleting it never invalidates a
branch that started from it. Called under the owning service's lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from loomrt.errors import Conflict, NotFound, Unavailable


@dataclass
class Checkpoint:
    """`position` positions of session `session`, their page image by state name, and (text)
    the exact tokens they hold and the pending prediction published with the pin."""

    name: str
    session: str
    position: int
    image: dict[str, np.ndarray] = field(repr=False)
    tokens: list[int] | None = None
    pending: int | None = None

    @property
    def host_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.image.values())


class Pins:
    def __init__(self, model: str, capacity: int):
        self.model = model
        self.capacity = capacity
        self.points: dict[str, Checkpoint] = {}

    def __len__(self) -> int:
        return len(self.points)

    @property
    def host_bytes(self) -> int:
        return sum(p.host_bytes for p in self.points.values())

    def require_enabled(self, param: str | None = None) -> None:
        if self.capacity == 0:
            raise NotFound(f"model '{self.model}' keeps no checkpoints (its checkpoint_capacity is 0)", param=param)

    def get(self, name: str, param: str | None = None) -> Checkpoint:
        """The checkpoint `name`; 404 when absent or the deployment keeps none."""
        self.require_enabled(param)
        point = self.points.get(name)
        if point is None:
            raise NotFound(f"model '{self.model}' has no checkpoint {name!r}", param=param)
        return point

    def check_room(self, name: str) -> None:
        """Before a service takes an image for `name`: enabled, unused name, room left."""
        self.require_enabled()
        if name in self.points:
            raise Conflict(f"checkpoint {name!r} exists already; delete it first")
        if len(self.points) >= self.capacity:
            raise Unavailable(f"model '{self.model}' keeps at most {self.capacity} checkpoints")

    def add(self, point: Checkpoint) -> Checkpoint:
        self.check_room(point.name)
        self.points[point.name] = point
        return point

    def remove(self, name: str, waiting: Iterable[Checkpoint | None]) -> None:
        """Delete a pin. Requests that already started own copies; queued ones (`waiting`: the
        checkpoints queued requests continue from) still need the image (409)."""
        point = self.get(name)
        if any(w is point for w in waiting):
            raise Conflict(f"checkpoint {name!r} has queued requests continuing from it")
        del self.points[name]


__all__ = ["Checkpoint", "Pins"]

"""Named checkpoints: immutable endpoints of a retained session, kept in KV pool pages of their own.

One implementation for every kind that retains sessions (text histories, sequence handles):
the service finds the session and the state holding it; `Pins` owns the rules every kind
shares (capacity, names, backing, deletion while a request still forks from it) and where
each pin's state lives.

* **Pinning** copies the session's pages into pool pages the pin owns (the pool keeps no
  reference counts, so a pin never shares a page a live row could overwrite): no live branch
  can change it, and deleting it never invalidates a branch that started from it, since every
  fork copies the pin's state into its own pages when it starts.
* **Backing** (the model document's `checkpoint_backing`). `fixed`: the pin stays in its
  device pages until released, and suspension is refused (400). `elastic`: `suspend` moves it
  to a host image (its pages return to the pool); the next use warms it back into newly
  allocated pages when the pool has room, else copies straight from the image. Nothing
  suspends a pin automatically: explicit pins stay protected until released.

Called under the owning service's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from loomrt.errors import Conflict, InvalidRequest, NotFound, Unavailable
from loomrt.kv import PagePool

BACKINGS = ("elastic", "fixed")


@dataclass(eq=False)
class Checkpoint:
    """`position` positions of session `session`, held in the pool `pages` the pin owns or (a
    suspended elastic pin) in a host `image` by state name, and (text) the exact tokens they
    hold and the pending prediction published with the pin."""

    name: str
    session: str
    position: int
    pages: list[int] = field(default_factory=list)
    image: dict[str, np.ndarray] | None = field(default=None, repr=False)
    tokens: list[int] | None = None
    pending: int | None = None

    @property
    def suspended(self) -> bool:
        return self.image is not None

    @property
    def host_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.image.values()) if self.image is not None else 0


class Pins:
    """The pins of one deployment over its pool and `per page` state."""

    def __init__(self, model: str, capacity: int, pool: PagePool, state: dict[str, np.ndarray],
                 backing: str = "elastic"):
        if backing not in BACKINGS:
            raise ValueError(f"unknown checkpoint backing {backing!r}")
        self.model = model
        self.capacity = capacity
        self.pool = pool
        self.state = state
        self.backing = backing
        self.points: dict[str, Checkpoint] = {}

    def __len__(self) -> int:
        return len(self.points)

    @property
    def host_bytes(self) -> int:
        return sum(p.host_bytes for p in self.points.values())

    @property
    def pages_held(self) -> int:
        return sum(len(p.pages) for p in self.points.values())

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
        """Before a service pins `name`: enabled, unused name, room left."""
        self.require_enabled()
        if name in self.points:
            raise Conflict(f"checkpoint {name!r} exists already; delete it first")
        if len(self.points) >= self.capacity:
            raise Unavailable(f"model '{self.model}' keeps at most {self.capacity} checkpoints")

    def pin(self, point: Checkpoint, source: list[int] | dict[str, np.ndarray],
            free_pages: Callable[[int], bool]) -> Checkpoint:
        """Keep `point`: copy its first `position` positions from `source` (pool pages, or a
        host image of them) into pages of its own. `free_pages(n)` makes `n` pages free by
        yielding the service's idle caches (False when it cannot): a pool held by running
        requests and other pins is an impossible reservation (503)."""
        self.check_room(point.name)
        n = self.pool.pages_for(point.position)
        if self.pool.free < n and not free_pages(n):
            raise Unavailable(f"model '{self.model}': the KV pool has no {n} free pages to pin checkpoint "
                              f"{point.name!r} ({self.pool.free} free; running requests and pins hold the rest)")
        point.pages = self.pool.reserve_pages(n)
        for name, array in self.state.items():
            array[point.pages] = array[source[:n]] if isinstance(source, list) else source[name][:n]
        self.points[point.name] = point
        return point

    def check_fits(self, pages: int) -> None:
        """A request needing `pages` pages must fit beside the pages pins hold (they never yield
        for it): otherwise its reservation is impossible (503), not a wait without end."""
        held = self.pages_held
        if held and pages > self.pool.pages - held:
            raise Unavailable(f"model '{self.model}': the request needs {pages} KV pages, but checkpoints hold "
                              f"{held} of the pool's {self.pool.pages}: delete or suspend one")

    def check_suspend(self, name: str) -> Checkpoint:
        """The pin `name` if it may be suspended: 404 when absent, 400 under fixed backing."""
        point = self.get(name)
        if self.backing != "elastic":
            raise InvalidRequest(f"checkpoint {name!r} of model '{self.model}' has {self.backing} backing: it stays "
                                 "in device pages until deleted (suspension needs checkpoint_backing \"elastic\")")
        return point

    def suspend(self, name: str) -> Checkpoint:
        """Elastic backing: move the pin's state to a host image and free its pages (again: no-op)."""
        point = self.check_suspend(name)
        if point.image is None:
            point.image = {k: array[point.pages].copy() for k, array in self.state.items()}
            self.pool.release(point.pages)
            point.pages = []
        return point

    def warm(self, point: Checkpoint, free_pages: Callable[[int], bool]) -> bool:
        """Resume a suspended pin into newly allocated pages when the pool can give them (after
        `free_pages` yields idle caches); False leaves it on the host."""
        if point.image is None:
            return True
        n = self.pool.pages_for(point.position)
        if self.pool.free < n and not free_pages(n):
            return False
        point.pages = self.pool.reserve_pages(n)
        for name, array in self.state.items():
            array[point.pages] = point.image[name][:n]
        point.image = None
        return True

    def copy_into(self, point: Checkpoint, pages: list[int]) -> None:
        """Start a branch: copy the pin's state into `pages` (the branch's own)."""
        n = self.pool.pages_for(point.position)
        for name, array in self.state.items():
            array[pages[:n]] = array[point.pages] if point.image is None else point.image[name][:n]

    def remove(self, name: str, waiting: Iterable[Checkpoint | None]) -> None:
        """Delete a pin. Requests that already started own copies; queued ones (`waiting`: the
        checkpoints queued requests continue from) still need its state (409)."""
        point = self.get(name)
        if any(w is point for w in waiting):
            raise Conflict(f"checkpoint {name!r} has queued requests continuing from it")
        del self.points[name]
        self.pool.release(point.pages)
        point.pages, point.image = [], None


class PinControls:
    """The checkpoint controls of a service that keeps `Pins` (`/v1/checkpoints/NAME`: look up,
    suspend, delete), one implementation for the text and sequence services. The service
    provides `_cond` (its lock), `pins`, `_pending` (queued jobs; a fork waiting on a pin has
    `_from` set) and `_account_host()` (charges host images to the ledger); pinning itself
    differs (what a session or handle is) and stays with each service."""

    def checkpoint(self, name: str, suspending: bool = False) -> Checkpoint:
        """The checkpoint `name` (404); `suspending`: 400 too when its backing is fixed."""
        with self._cond:
            return self.pins.check_suspend(name) if suspending else self.pins.get(name)

    def suspend(self, name: str) -> Checkpoint:
        """Elastic backing: park the pin in host memory, its pool pages freed."""
        with self._cond:
            point = self.pins.suspend(name)
            self._account_host()
            return point

    def unpin(self, name: str) -> None:
        """Delete a pin. Requests already started from it own copies; queued ones still need it (409)."""
        with self._cond:
            self.pins.remove(name, (getattr(j, "_from", None) for j in self._pending))
            self._account_host()


__all__ = ["BACKINGS", "Checkpoint", "PinControls", "Pins"]

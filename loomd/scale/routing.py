"""Which replica serves a request: state stays where it lives, the rest goes by load.

Plain Python, no Ray: the ingress (`loomd/scale/ingress.py`) asks, the tests drive it directly.

    X-Loom-Checkpoint NAME        the replica that pinned NAME (ownership table), else the ring
    /v1/sequences `session`       the replica that issued the handle (learned from its
                                  `attached` event), else the ring
    X-Loom-Session SESSION        the session's owner, else the ring; recorded as owner
    untagged chat                 the replica that served the longest prefix of this message
                                  history (a chain of hashes over the canonical messages), unless it
                                  is SPILL requests busier than the least-loaded one; else the
                                  least-loaded replica
    anything else                 the least-loaded replica (fewest requests in flight through us)

The ring is consistent hashing with virtual nodes over the live replicas, so adding or
losing a replica moves only the keys that hash to it. The ownership tables remember where
state was made, which is what matters once the ring has changed. A replica that dies takes
its state with it: its handles and checkpoints are `Lost` (the spec's 404 for a handle that
has been invalidated), its sessions move to the ring's new owner (a session is best effort:
the survivor replays the history the request carries), and its prefixes are forgotten.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

VIRTUAL_NODES = 64
TABLE_ENTRIES = 65536   # per ownership table (LRU)
SPILL = 2               # in-flight requests an affinity target may exceed the least-loaded one by


class Lost(Exception):
    """The state a request names lived on a replica that is gone."""

    def __init__(self, what: str, replica: int):
        super().__init__(f"{what} lived on replica {replica}, which is gone; its state is lost")
        self.replica = replica


def _point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing of string keys onto member ids."""

    def __init__(self, members: Iterable[int] = (), vnodes: int = VIRTUAL_NODES):
        self.vnodes = vnodes
        self._points: list[tuple[int, int]] = []
        for member in members:
            self.add(member)

    def add(self, member: int) -> None:
        for v in range(self.vnodes):
            bisect.insort(self._points, (_point(f"replica-{member}-{v}"), member))

    def remove(self, member: int) -> None:
        self._points = [p for p in self._points if p[1] != member]

    @property
    def members(self) -> set[int]:
        return {m for _, m in self._points}

    def owner(self, key: str) -> int | None:
        if not self._points:
            return None
        i = bisect.bisect(self._points, (_point(key), -1)) % len(self._points)
        return self._points[i][1]


class _Table(OrderedDict):
    """A bounded LRU map: the oldest entries go first."""

    def __init__(self, entries: int = TABLE_ENTRIES):
        super().__init__()
        self.entries = entries

    def get_recent(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.entries:
            self.popitem(last=False)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prefix_chain(model: str, body: dict[str, Any]) -> list[str]:
    """One hash per leading run of the chat's messages (1, 2, ... all of them), each chained on
    the one before and seeded with the model and the tools (which the template puts first): a
    later turn's history starts with an earlier turn's messages, so it shares their hashes."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    digest = hashlib.blake2b(canonical([model, body.get("tools")]).encode(), digest_size=16)
    chain = []
    for message in messages:
        digest.update(canonical(message).encode())
        chain.append(digest.copy().hexdigest())
    return chain


@dataclass
class Replica:
    index: int
    alive: bool = True
    in_flight: int = 0
    served: int = 0


@dataclass
class Router:
    """The routing state of one ingress."""

    replicas: list[Replica] = field(default_factory=list)
    affinity: bool = True
    spill: int = SPILL
    entries: int = TABLE_ENTRIES

    def __post_init__(self) -> None:
        self.ring = HashRing(r.index for r in self.replicas if r.alive)
        # Keyed by name alone: the spec scopes names to a deployment, so equal names on two
        # models are two states; keying both to one replica only co-locates them.
        self.sessions = _Table(self.entries)      # session -> replica
        self.handles = _Table(self.entries)       # sequence handle -> replica
        self.checkpoints = _Table(self.entries)   # checkpoint name -> replica
        self.prefixes = _Table(self.entries)      # prefix hash -> replica
        self.reasons: dict[str, int] = {}

    @classmethod
    def of(cls, count: int, **options: Any) -> "Router":
        return cls([Replica(i) for i in range(count)], **options)

    # ---- membership ------------------------------------------------------------------------

    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def add(self) -> Replica:
        replica = Replica(len(self.replicas))
        self.replicas.append(replica)
        self.ring.add(replica.index)
        return replica

    def lose(self, index: int) -> None:
        """Replica `index` is gone: off the ring, its prefixes forgotten (its handles and
        checkpoints stay recorded, so requests naming them learn they are lost)."""
        replica = self.replicas[index]
        if not replica.alive:
            return
        replica.alive = False
        self.ring.remove(index)
        for key in [k for k, v in self.prefixes.items() if v == index]:
            del self.prefixes[key]

    # ---- decisions ---------------------------------------------------------------------------

    def _count(self, reason: str) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def least_loaded(self) -> int | None:
        alive = self.alive()
        if not alive:
            return None
        return min(alive, key=lambda r: (r.in_flight, r.served, r.index)).index

    def _ring(self, key: str) -> int | None:
        return self.ring.owner(key)

    def _owned(self, table: _Table, key: str, what: str) -> int | None:
        owner = table.get_recent(key)
        if owner is None:
            return self._ring(key)
        if not self.replicas[owner].alive:
            raise Lost(what, owner)
        return owner

    def for_checkpoint(self, name: str) -> int | None:
        self._count("checkpoint")
        return self._owned(self.checkpoints, name, f"checkpoint {name!r}")

    def for_handle(self, handle: str) -> int | None:
        self._count("handle")
        return self._owned(self.handles, handle, "the sequence handle")

    def for_session(self, session: str) -> int | None:
        """The session's owner (a sequence handle used as a session is its issuer's); a lost
        owner's chat sessions move to the ring (best effort: the survivor replays them)."""
        if session in self.handles:
            return self.for_handle(session)
        self._count("session")
        owner = self.sessions.get_recent(session)
        if owner is None or not self.replicas[owner].alive:
            owner = self._ring(session)
            if owner is not None:
                self.sessions.put(session, owner)
        return owner

    def for_chat(self, model: str, body: dict[str, Any]) -> int | None:
        """The replica likely to hold the longest prefix of this history, else the least-loaded."""
        least = self.least_loaded()
        if self.affinity and least is not None:
            for digest in reversed(prefix_chain(model, body)):
                owner = self.prefixes.get_recent(digest)
                if owner is not None and self.replicas[owner].alive:
                    if self.replicas[owner].in_flight - self.replicas[least].in_flight < self.spill:
                        self._count("prefix")
                        return owner
                    break
        self._count("load")
        return least

    def for_load(self) -> int | None:
        self._count("load")
        return self.least_loaded()

    # ---- what the replicas' answers teach ---------------------------------------------------------

    def served_chat(self, model: str, body: dict[str, Any], replica: int) -> None:
        for digest in prefix_chain(model, body):
            self.prefixes.put(digest, replica)

    def issued_handle(self, handle: str, replica: int) -> None:
        self.handles.put(handle, replica)

    def pinned(self, name: str, replica: int) -> None:
        self.checkpoints.put(name, replica)

    def unpinned(self, name: str) -> None:
        self.checkpoints.pop(name, None)

    def moved_session(self, session: str, replica: int) -> None:
        self.sessions.put(session, replica)

    def describe(self) -> dict[str, Any]:
        return {"affinity": self.affinity, "spill": self.spill, "decisions": dict(self.reasons),
                "owned": {"sessions": len(self.sessions), "handles": len(self.handles),
                          "checkpoints": len(self.checkpoints), "prefixes": len(self.prefixes)},
                "replicas": [{"replica": r.index, "alive": r.alive, "in_flight": r.in_flight, "served": r.served}
                             for r in self.replicas]}


__all__ = ["HashRing", "Lost", "Replica", "Router", "canonical", "prefix_chain"]

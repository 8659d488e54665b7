"""A request's output events, from a service worker to one reader, bounded by output credit.

Streaming kinds (text, sequences, speech) hand their output through an `Outbox`: the worker
`put`s events, the reader takes them, and a request whose reader has left `credit` events
untaken is skipped by its service until the reader catches up, so a slow reader pauses only
its own request.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

DEFAULT_CREDIT = 64


class Outbox:
    """Events from the service worker to one reader, bounded by output credit.

    The worker `put`s ("delta", {...}), ("done", {...}) or ("error", LoomError); the reader
    takes them with `get` (a thread) or `aget` (an asyncio task on the loop given). A reader
    that wants only the outcome (a complete, non-streamed response) passes `deltas=False`:
    text deltas are then not kept, so they never use up the row's credit."""

    def __init__(self, credit: int = DEFAULT_CREDIT, loop: asyncio.AbstractEventLoop | None = None, *,
                 deltas: bool = True):
        self.credit = credit
        self.deltas = deltas
        self._events: collections.deque[tuple[str, Any]] = collections.deque()
        self._cond = threading.Condition()
        self._loop = loop
        self._ready = asyncio.Event() if loop is not None else None
        self.wake_worker = lambda: None

    def put(self, kind: str, payload: Any) -> None:
        if kind == "delta" and not self.deltas:
            return
        with self._cond:
            self._events.append((kind, payload))
            self._cond.notify_all()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._ready.set)

    def has_credit(self) -> bool:
        return self.room() > 0

    def room(self) -> int:
        """Events the worker may still put before the reader must take some."""
        with self._cond:
            return max(self.credit - len(self._events), 0)

    def _take(self) -> tuple[str, Any]:
        full = len(self._events) >= self.credit
        event = self._events.popleft()
        if full:
            self.wake_worker()
        return event

    def get(self, timeout: float | None = None) -> tuple[str, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._events, timeout):
                raise TimeoutError("no output event in time")
            return self._take()

    async def aget(self) -> tuple[str, Any]:
        assert self._ready is not None, "Outbox.aget needs the loop it was created with"
        while True:
            with self._cond:
                if self._events:
                    return self._take()
                self._ready.clear()
            await self._ready.wait()


__all__ = ["DEFAULT_CREDIT", "Outbox"]

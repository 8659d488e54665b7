"""The server's structured log journal: bounded, with monotonically numbered entries.

Registry lifecycle events and completed inference requests (`event: "request"`, from the
inference routes) are appended from any thread; readers poll
(`GET /logz`, JSONL, a cursor) or stream (`GET /logz/stream`, SSE, event ids) with their own
cursors. A cursor older than the retained window gets an explicit gap record naming what
was lost, never a silent jump.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

RETAINED = 4096


class Journal:
    def __init__(self, retained: int = RETAINED):
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=retained)
        self._next = 1
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._changed = asyncio.Event()

    def publish(self, record: dict[str, Any]) -> int:
        with self._lock:
            entry = {"id": self._next, "time": record.get("time", time.time()), **record}
            entry["id"] = self._next
            self._next += 1
            self._entries.append(entry)
        self._wake()
        return entry["id"]

    def publish_threadsafe(self, record: dict[str, Any]) -> None:
        self.publish(record)

    def _wake(self) -> None:
        loop, changed = self._loop, self._changed
        if loop is None or changed is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            changed.set()
        else:
            loop.call_soon_threadsafe(changed.set)

    @property
    def last_id(self) -> int:
        with self._lock:
            return self._next - 1

    def since(self, after: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Entries with id > after (at most `limit`), and a gap record if some were dropped."""
        with self._lock:
            oldest = self._entries[0]["id"] if self._entries else self._next
            gap = None
            if after + 1 < oldest:
                gap = {"event": "gap", "from": after + 1, "to": oldest - 1, "missed": oldest - 1 - after}
            out = [e for e in self._entries if e["id"] > after][:limit]
        return out, gap

    async def wait(self, after: int, timeout: float) -> None:
        """Return when an entry newer than `after` exists, or after `timeout` seconds."""
        if self._changed is None:
            return
        while self.last_id <= after:
            self._changed.clear()
            if self.last_id > after:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except asyncio.TimeoutError:
                return


__all__ = ["Journal", "RETAINED"]

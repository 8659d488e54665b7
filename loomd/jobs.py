"""Waiting for work a runtime thread finishes: the one way a handler awaits a job's future.

A handler awaits the job through `asyncio.shield`, so the client leaving cancels the handler
and not the runtime's future; `on_leave` (a job's `cancel`) then withdraws the work at its
next boundary. The future still completes later, usually with the cancellation as its
exception: that outcome is retrieved here so asyncio does not log "Future exception was never
retrieved" for every client that left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any


def _retrieve(done: asyncio.Future) -> None:
    if not done.cancelled():
        done.exception()


async def finished(future: concurrent.futures.Future, on_leave: Callable[[], Any] | None = None) -> Any:
    """The result of `future`; if the client leaves first, `on_leave()` runs and the
    cancellation propagates."""
    waiting = asyncio.wrap_future(future)
    try:
        return await asyncio.shield(waiting)
    except (asyncio.CancelledError, ConnectionError):
        waiting.add_done_callback(_retrieve)
        if on_leave is not None:
            on_leave()
        raise


__all__ = ["finished"]

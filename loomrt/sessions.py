"""Retained conversations: finished histories whose KV stays resident for reuse.

When a generation finishes, its row's pages are not freed: the history they hold (the exact
token ids of every written position) stays in that now idle row. The next request that
starts is matched against these histories:

- a request with a session name (`X-Loom-Session`) takes only that session's history;
- an untagged request takes the untagged history with the longest common token prefix.

The matched pages covering the common prefix become the new request's own, so only the new
suffix is prefilled (`cached_tokens` reports the prefix). The idle row advances in place:
the old branch is gone (keeping it needs a checkpoint). Idle histories hold rows and pages:
when a new request needs a row or pages, the least recently used idle history yields. A
named one then moves to host memory when `session_cache_capacity` allows (a copy of its
pages' state, restored into fresh pages on reuse), else it is dropped and the next turn of
that session replays its history.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from loomrt.errors import InvalidRequest
from loomrt.kv import PagePool

SESSION_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")   # whole string: fullmatch, so a trailing "\n" fails

# `/v1/sessions` pages by `order` across every deployment: one process-wide counter keeps it unique.
ORDERS = itertools.count(1)


def check_session_name(name: str, header: str = "X-Loom-Session") -> str:
    if not SESSION_NAME.fullmatch(name):
        raise InvalidRequest(f"{header} must be 1-64 ASCII letters, digits, '_', '.' or '-', got {name!r}",
                             param=header)
    return name


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class History:
    tokens: list[int]                         # the token id at every position held
    pages: list[int]                          # pool pages holding them (empty when on the host)
    session: str | None
    order: int
    last_used: int = 0
    snapshot: dict[str, np.ndarray] | None = field(default=None, repr=False)  # host copy of the pages
    pending: int | None = None                # the sampled token not yet written (the next to feed)

    @property
    def in_row(self) -> bool:
        return self.snapshot is None


class HistoryStore:
    """The idle histories of one text service. Called under the service lock, on its worker."""

    def __init__(self, pool: PagePool, state: dict[str, np.ndarray], rows: int, session_cache_capacity: int):
        self.pool = pool
        self.state = state
        self.rows = rows
        self.session_cache_capacity = session_cache_capacity
        self.histories: list[History] = []
        self._clock = itertools.count(1)

    # ---- queries ------------------------------------------------------------------------------

    @property
    def rows_held(self) -> int:
        return sum(1 for h in self.histories if h.in_row)

    def listing(self) -> list[dict[str, Any]]:
        return [{"session": h.session, "position": len(h.tokens), "residency": "row" if h.in_row else "host",
                 "order": h.order} for h in self.histories if h.session is not None]

    def take(self, prompt: list[int], session: str | None) -> tuple[History | None, int]:
        """Remove and return the history to continue from, with the usable prefix length. At
        least one prompt token is always left to feed, so the step has logits to sample."""
        limit = len(prompt) - 1
        if session is not None:
            found = next((h for h in self.histories if h.session == session), None)
            if found is None:
                return None, 0
            self.histories.remove(found)
            return found, min(common_prefix(found.tokens, prompt), limit)
        best, best_len = None, 0
        for h in self.histories:
            if h.session is None:
                n = min(common_prefix(h.tokens, prompt), limit)
                if n > best_len:
                    best, best_len = h, n
        if best is not None:
            self.histories.remove(best)
        return best, best_len

    # ---- keeping ------------------------------------------------------------------------------

    def keep(self, tokens: list[int], pages: list[int], session: str | None, pending: int | None = None) -> None:
        """Retain a finished row's history. A named session replaces its older history."""
        for old in [h for h in self.histories if session is not None and h.session == session]:
            self._drop(old)
        self.histories.append(History(tokens, pages, session, next(ORDERS), next(self._clock),
                                      pending=pending))

    def _drop(self, h: History) -> None:
        self.histories.remove(h)
        if h.pages:
            self.pool.release(h.pages)
            h.pages = []

    def _yield_one(self) -> bool:
        """Free the least recently used idle row: to host memory if named and the session cache
        has room, else dropped. False when no idle row is left."""
        in_rows = sorted((h for h in self.histories if h.in_row), key=lambda h: h.last_used)
        if not in_rows:
            return False
        victim = in_rows[0]
        on_host = sum(1 for h in self.histories if not h.in_row)
        if victim.session is not None and on_host < self.session_cache_capacity:
            victim.snapshot = {name: array[victim.pages].copy() for name, array in self.state.items()}
            self.pool.release(victim.pages)
            victim.pages = []
        else:
            self._drop(victim)
        return True

    def make_room(self, active_rows: int, pages: int, reclaim: Callable[[], bool] = lambda: False) -> bool:
        """Yield idle histories until a new row is free, and `pages` pages: for pages, `reclaim`
        (the prefix cache: shared prefixes are the cheaper loss) goes before idle histories."""
        while active_rows + self.rows_held >= self.rows:
            if not self._yield_one():
                return False
        while self.pool.free < pages:
            if not reclaim() and not self._yield_one():
                return False
        return True

    def free_pages(self, pages: int, reclaim: Callable[[], bool] = lambda: False, keep: History | None = None) -> bool:
        """Yield idle histories (other than `keep`) until `pages` pages are free, after
        `reclaim` (the prefix cache); for a pin, which needs pages but no row."""
        held = keep is not None and keep in self.histories
        if held:
            self.histories.remove(keep)
        try:
            while self.pool.free < pages:
                if not reclaim() and not self._yield_one():
                    return False
            return True
        finally:
            if held:
                self.histories.append(keep)

    def restore(self, h: History, pages: list[int], positions: int) -> None:
        """Copy a history's host snapshot (its first `positions` positions) into fresh pages."""
        n = self.pool.pages_for(positions)
        for name, array in self.state.items():
            array[pages[:n]] = h.snapshot[name][:n]

    def snapshot_bytes(self) -> int:
        return sum(a.nbytes for h in self.histories if h.snapshot for a in h.snapshot.values())



__all__ = ["ORDERS", "History", "HistoryStore", "check_session_name", "common_prefix"]

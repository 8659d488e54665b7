"""The prefix cache of a text service: exact KV state of shared input prefixes, kept in the pool.

Retained histories (`loomrt/sessions.py`) keep whole conversations in their rows, but a row
advances in place, so the state of a prefix that several conversations share (a long
system prompt, a document asked about twice) is lost as soon as its row moves on. The
prefix cache keeps copies of such prefixes in pool pages of their own, bounded by the
document's `prefix_cache_capacity` (KV positions, counted in whole pages).

* **What is stored.** Exact state at *natural prefill boundaries*: the service cuts prompt
  prefill into chunks that end at multiples of its prefill chunk (`stride`), and the state
  after such a chunk is offered as an entry (prompt tokens up to the boundary). When the
  prompt's prefill ends, the state at the prompt's end (a *later boundary*) is offered too,
  but it is only kept in capacity nobody uses: that extension never evicts another prefix.
  A job's later offers extend the entry it stored itself (same pages plus the new ones).
* **Eviction.** A natural boundary may evict the least recently used entries, except the
  ancestor the offering request started from, so even a one-entry cache keeps the first
  matching ancestor rather than trading it for a descendant. Pool pressure (a request that
  needs pages) reclaims entries, least recently used first.
* **Matching.** Exact token identity: the entry with the longest common prefix wins, and at
  least one prompt token is always left to feed so the step has logits to sample. Any
  prefix of an entry is exact state (a position's KV depends only on the tokens before it),
  so an entry serves every prompt that shares some of its tokens. Using an entry copies its
  pages into the request's own; the entry stays.

Called under the text service's lock, on its worker.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from loomrt.kv import PagePool
from loomrt.sessions import common_prefix


@dataclass(eq=False)
class Prefix:
    tokens: list[int]          # the prompt tokens whose state the pages hold, position by position
    pages: list[int]
    natural: bool              # stored at a natural boundary (False: a later boundary at a prompt's end)
    last_used: int = 0


class PrefixCache:
    def __init__(self, pool: PagePool, state: dict[str, np.ndarray], capacity: int, stride: int):
        self.pool = pool
        self.state = state
        self.capacity_pages = capacity // pool.page_size if pool.page_size else 0
        self.stride = stride
        self.entries: list[Prefix] = []
        self._clock = itertools.count(1)

    @property
    def enabled(self) -> bool:
        return self.capacity_pages > 0

    @property
    def pages_held(self) -> int:
        return sum(len(e.pages) for e in self.entries)

    def listing(self) -> list[dict[str, Any]]:
        return [{"positions": len(e.tokens), "pages": len(e.pages), "natural": e.natural} for e in self.entries]

    # ---- use ----------------------------------------------------------------------------------

    def match(self, prompt: list[int]) -> tuple[Prefix | None, int]:
        """The entry sharing the longest prefix with `prompt`, and the usable length."""
        limit = len(prompt) - 1
        best, best_len = None, 0
        for entry in self.entries:
            n = min(common_prefix(entry.tokens, prompt), limit)
            if n > best_len:
                best, best_len = entry, n
        return best, best_len

    def copy_into(self, entry: Prefix, pages: list[int], positions: int) -> None:
        """Copy the state of the entry's first `positions` positions into `pages` (a request's own)."""
        entry.last_used = next(self._clock)
        n = self.pool.pages_for(positions)
        for array in self.state.values():
            array[pages[:n]] = array[entry.pages[:n]]

    # ---- storing ------------------------------------------------------------------------------

    def offer(self, tokens: list[int], source_pages: list[int], *, natural: bool,
              ancestor: Prefix | None = None, own: Prefix | None = None) -> Prefix | None:
        """Keep the state of `tokens` (held in `source_pages`, a running request's pages).
        `ancestor`: the entry the request started from (never evicted for it); `own`: the entry
        the request stored at an earlier boundary (extended in place). Returns the entry that
        now holds the request's boundary, or `own` when nothing was stored."""
        if own is not None and own not in self.entries:
            own = None               # evicted since (pool pressure, another request's boundary)
        if not self.enabled or not tokens:
            return own
        for entry in self.entries:   # already held (the ancestor, or an equal prompt stored before)
            if entry is not own and common_prefix(entry.tokens, tokens) == len(tokens):
                entry.last_used = next(self._clock)
                return own
        need = self.pool.pages_for(len(tokens))
        kept = len(own.tokens) // self.pool.page_size if own is not None else 0   # own's full pages stay
        extra = need - kept
        released = len(own.pages) - kept if own is not None else 0
        if self.pages_held - released + extra > self.capacity_pages:
            if not natural:
                return own           # a later boundary only uses capacity nobody uses
            if not self._evict(self.pages_held - released + extra - self.capacity_pages, {ancestor, own}):
                return own
        if extra - released > self.pool.free:
            return own               # the pool is busy serving requests: keep nothing now
        if own is not None:
            self.pool.release(own.pages[kept:])
            self.entries.remove(own)
            pages = own.pages[:kept]
        else:
            pages = []
        fresh = self.pool.reserve_pages(extra)
        for array in self.state.values():
            array[fresh] = array[source_pages[kept:need]]
        entry = Prefix(list(tokens), pages + fresh, natural, next(self._clock))
        self.entries.append(entry)
        return entry

    def _evict(self, pages: int, protected: set) -> bool:
        """Drop least recently used entries outside `protected` until `pages` pages are freed;
        False (nothing dropped) when that is impossible."""
        candidates = sorted((e for e in self.entries if e not in protected), key=lambda e: e.last_used)
        if sum(len(e.pages) for e in candidates) < pages:
            return False
        freed = 0
        for entry in candidates:
            if freed >= pages:
                break
            freed += len(entry.pages)
            self.drop(entry)
        return True

    def drop(self, entry: Prefix) -> None:
        self.entries.remove(entry)
        self.pool.release(entry.pages)
        entry.pages = []

    def reclaim_one(self, keep: Prefix | None = None) -> bool:
        """Pool pressure: free the least recently used entry other than `keep` (the one a
        starting request is about to copy). False when none is left."""
        others = [e for e in self.entries if e is not keep]
        if not others:
            return False
        self.drop(min(others, key=lambda e: e.last_used))
        return True


__all__ = ["Prefix", "PrefixCache"]

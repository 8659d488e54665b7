"""The KV page pool of a text or sequence deployment: fixed-size pages from one shared pool.

`per page` state arrays are indexed by page; a row's page table lists the pages that hold
its positions in order (`page_size` positions each). A request reserves every page it can
need when it starts (prompt plus its output budget, capped by the context), so a running
row can never run out of pages mid-generation; the pages return to the pool when the
request ends, fails or is cancelled.
"""

from __future__ import annotations

import math


class PagePool:
    def __init__(self, pages: int, page_size: int):
        self.pages = pages
        self.page_size = page_size
        self._free = list(range(pages - 1, -1, -1))   # pop() hands out low page numbers first

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.pages - len(self._free)

    def pages_for(self, positions: int) -> int:
        return math.ceil(positions / self.page_size)

    def reserve(self, positions: int) -> list[int] | None:
        """Pages for `positions` positions, or None when the pool cannot hold them now."""
        n = self.pages_for(positions)
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def reserve_pages(self, n: int) -> list[int]:
        """Exactly `n` pages; the caller made sure they are free."""
        if n > len(self._free):
            raise RuntimeError(f"{n} pages asked, {len(self._free)} free")
        return [self._free.pop() for _ in range(max(n, 0))]

    def release(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


__all__ = ["PagePool"]

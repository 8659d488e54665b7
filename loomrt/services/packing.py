"""One packed step over many rows of a paged KV cache: the inputs every token-stepping kind builds.

    rows:        r0: ids a0 a1 a2 (positions 7..9)   r1: id b0 (position 30)
    tokens       a0 a1 a2 b0
    positions    7  8  9  30
    rows         0  0  0  1
    last         2  3                      (the index in `tokens` of each row's last id)
    page_table   [[p, q, -1, ...], [s, t, u, -1, ...]]   (-1: no page)

Text (prefill chunks and decode rows), decisions (whole question prompts) and sequences
(known-id chunks) all pack their rows with `pack_rows`; each adds its own per-row inputs
(sampling, answer choices) around it. The arrays depend only on the rows given, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NO_PAGE = -1


@dataclass(frozen=True)
class TokenRow:
    """One row of a packed step: the job it belongs to, the ids it feeds, the position of the
    first, and the KV pages holding the row's positions."""

    job: Any
    tokens: tuple[int, ...]
    start: int
    pages: tuple[int, ...]


def pack_rows(rows: Sequence[TokenRow], pages_per_row: int | None = None) -> dict[str, np.ndarray]:
    """`tokens`, `positions`, `rows`, `last` and `page_table` (width `pages_per_row`, else the
    most pages any row has) of one step.

    Built as Python lists and turned into arrays by `np.array` alone: between decode steps the
    weights' stream has evicted numpy's code from the caches, and each distinct numpy routine
    costs its misses again. Eight routines took 53 us at batch 1 and 111 us at 8 rows served
    against 14 and 46 us this way (12 us either way warm; docs/performance.md)."""
    width = pages_per_row if pages_per_row is not None else max((len(r.pages) for r in rows), default=0)
    tokens: list[int] = []
    positions: list[int] = []
    owners: list[int] = []
    last: list[int] = []
    table: list[int] = []
    for i, r in enumerate(rows):
        n = len(r.tokens)
        tokens.extend(r.tokens)
        positions.extend(range(r.start, r.start + n))
        owners.extend([i] * n)
        last.append(len(tokens) - 1)
        pad = width - len(r.pages)
        if pad < 0:   # the flat table would reshape into shifted rows instead of failing
            raise ValueError(f"row {i} has {len(r.pages)} pages, more than the table's {width}")
        table.extend(r.pages)
        table.extend([NO_PAGE] * pad)
    return {"tokens": np.array(tokens, np.int32), "positions": np.array(positions, np.int32),
            "rows": np.array(owners, np.int32), "last": np.array(last, np.int32),
            "page_table": np.array(table, np.int32).reshape(len(rows), width)}


__all__ = ["pack_sequences", "NO_PAGE", "TokenRow", "pack_rows"]


def pack_sequences(sequences: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """Whole inputs packed back to back, as the embedding and image contracts read them:
    `tokens`, `positions` (within each input), `seq` (the input), `starts` and `lengths`."""
    lengths = np.array([len(s) for s in sequences], np.int32)
    starts = np.zeros(len(sequences), np.int32)
    np.cumsum(lengths[:-1], out=starts[1:])
    tokens = np.fromiter((t for s in sequences for t in s), np.int32, int(lengths.sum()))
    return {"tokens": tokens, "positions": np.arange(len(tokens), dtype=np.int32) - np.repeat(starts, lengths),
            "seq": np.repeat(np.arange(len(sequences), dtype=np.int32), lengths), "starts": starts,
            "lengths": lengths}


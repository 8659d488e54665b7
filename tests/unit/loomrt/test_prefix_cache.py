"""loomrt/prefixes.py: what the prefix cache keeps, what it evicts, and that the state it hands
back is the exact state of the positions it matched (a real PagePool over numpy state)."""

from __future__ import annotations

import numpy as np

from loomrt.kv import PagePool
from loomrt.prefixes import PrefixCache

PAGE = 4
STRIDE = 8


def setup(pages=32, capacity_positions=16):
    pool = PagePool(pages, PAGE)
    state = {"k": np.zeros((pages, PAGE, 2), np.float32), "v": np.zeros((pages, PAGE, 2), np.float32)}
    return pool, state, PrefixCache(pool, state, capacity_positions, STRIDE)


def prefill(pool, state, tokens):
    """A 'request' whose pages hold, at each position, a value derived from the tokens up to it."""
    pages = pool.reserve(len(tokens))
    for pos in range(len(tokens)):
        value = float(sum(tokens[:pos + 1]))
        state["k"][pages[pos // PAGE], pos % PAGE] = value
        state["v"][pages[pos // PAGE], pos % PAGE] = -value
    return pages


def read(state, pages, positions):
    return [float(state["k"][pages[p // PAGE], p % PAGE, 0]) for p in range(positions)]


def test_offers_keep_exact_state_and_matching_copies_it():
    pool, state, cache = setup()
    tokens = list(range(1, 9))                 # 8 tokens: one natural boundary
    pages = prefill(pool, state, tokens)
    entry = cache.offer(tokens, pages, natural=True)
    assert entry is not None and entry.tokens == tokens and len(entry.pages) == 2
    assert set(entry.pages).isdisjoint(pages)  # its own pages, not the request's
    expected = read(state, pages, 8)
    pool.release(pages)
    state["k"][pages] = 99.0                   # the request's pages are reused by someone else

    found, n = cache.match(tokens[:6] + [42, 43])
    assert found is entry and n == 6
    mine = pool.reserve(8)
    cache.copy_into(found, mine, n)
    assert read(state, mine, 6) == expected[:6]


def test_match_leaves_one_prompt_token_to_feed():
    pool, state, cache = setup()
    tokens = list(range(1, 9))
    cache.offer(tokens, prefill(pool, state, tokens), natural=True)
    assert cache.match(tokens)[1] == 7
    assert cache.match(tokens + [5])[1] == 8
    assert cache.match([7, 7, 7]) == (None, 0)


def test_a_later_boundary_extends_the_own_entry_but_never_evicts():
    pool, state, cache = setup(capacity_positions=16)    # 4 pages
    a = list(range(1, 15))                              # 14 tokens: boundary 8, end 14
    pages = prefill(pool, state, a)
    own = cache.offer(a[:8], pages, natural=True)
    own = cache.offer(a, pages, natural=False, own=own)   # extends to the prompt's end: 4 pages
    assert [e.tokens for e in cache.entries] == [a]
    assert read(state, own.pages, 14) == read(state, pages, 14)

    b = [50 + i for i in range(10)]
    pages_b = prefill(pool, state, b)
    assert cache.offer(b, pages_b, natural=False) is None         # no unused capacity: not kept
    assert [e.tokens for e in cache.entries] == [a]


def test_a_natural_boundary_evicts_lru_but_not_its_ancestor():
    pool, state, cache = setup(capacity_positions=8)     # 2 pages: one 8-token entry
    a = list(range(1, 9))
    ancestor = cache.offer(a, prefill(pool, state, a), natural=True)
    longer = a + list(range(20, 28))                      # descends from the cached entry
    kept = cache.offer(longer, prefill(pool, state, longer), natural=True, ancestor=ancestor)
    assert kept is None and cache.entries == [ancestor]   # a one-slot cache keeps its first ancestor

    other = [90 + i for i in range(8)]                    # a new branch may evict it
    entry = cache.offer(other, prefill(pool, state, other), natural=True)
    assert cache.entries == [entry] and entry.tokens == other


def test_pool_pressure_reclaims_entries_and_keep_is_spared():
    pool, state, cache = setup(pages=8, capacity_positions=32)
    a, b = list(range(1, 9)), list(range(11, 19))
    ea = cache.offer(a, prefill(pool, state, a), natural=True)
    eb = cache.offer(b, prefill(pool, state, b), natural=True)
    assert cache.pages_held == 4
    assert cache.reclaim_one(keep=ea) and cache.entries == [ea] and eb.pages == []
    assert not cache.reclaim_one(keep=ea)
    assert cache.reclaim_one() and cache.entries == []


def test_disabled_cache_keeps_nothing():
    pool, state, cache = setup(capacity_positions=0)
    tokens = list(range(1, 9))
    assert cache.offer(tokens, prefill(pool, state, tokens), natural=True) is None
    assert not cache.enabled and cache.entries == []

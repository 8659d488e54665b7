"""kv_write + paged_attention against dense causal attention in numpy, row by row.

A small paged cache with a scrambled page table, ragged rows (a prefill chunk, then a
continuation chunk and single decode tokens in one packed step), grouped-query heads and
a padding token."""

import numpy as np
import pytest

CONFIGS = [  # heads, kv_heads, head_dim, page_size
    (2, 1, 8, 4),
    (4, 2, 16, 8),
    (6, 3, 10, 4),
    (9, 3, 64, 16),
]
LAYERS, LAYER = 2, 1


def dense_attention(q, keys, values, heads, kv_heads, scale):
    """o[h] = softmax(q[h] . K_g^T * scale) . V_g with g = h // (heads // kv_heads)."""
    hd = q.shape[0] // heads
    out = np.zeros(q.shape[0])
    for h in range(heads):
        g = h // (heads // kv_heads)
        k = keys[:, g * hd:(g + 1) * hd]
        v = values[:, g * hd:(g + 1) * hd]
        s = k @ q[h * hd:(h + 1) * hd] * scale
        w = np.exp(s - s.max())
        out[h * hd:(h + 1) * hd] = (w / w.sum()) @ v
    return out


def pack(steps_for_rows):
    """[(row, [positions])] -> rows, positions arrays for one packed step."""
    rows = [r for r, ps in steps_for_rows for _ in ps]
    positions = [p for _, ps in steps_for_rows for p in ps]
    return np.array(rows, np.int32), np.array(positions, np.int32)


def packed_step(rng, steps_for_rows, qd: int, kd: int, padding_position: int = 0):
    """One packed step with a padding token (row -1) at the end, and random q, k, v for its
    tokens: rows, positions, q, k, v."""
    rows, positions = pack(steps_for_rows)
    rows = np.append(rows, -1).astype(np.int32)
    positions = np.append(positions, padding_position).astype(np.int32)
    q, k, v = (rng.standard_normal((len(rows), width)).astype(np.float32) for width in (qd, kd, kd))
    return rows, positions, q, k, v


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "h{}-kv{}-d{}-s{}".format(*c))
def test_paged_attention_matches_dense(kernel, rng, config):
    heads, kv_heads, hd, page_size = config
    qd, kd = heads * hd, kv_heads * hd
    num_rows, pages_per_row, num_pages = 3, 4, 16
    page_table = np.full((num_rows, pages_per_row), -1, np.int32)
    scrambled = rng.permutation(num_pages)
    for r in range(num_rows):
        page_table[r] = scrambled[r * pages_per_row:(r + 1) * pages_per_row]
    k_cache = np.zeros((num_pages, LAYERS, page_size, kd), np.float32)
    v_cache = np.zeros_like(k_cache)
    dense_k = {r: np.zeros((0, kd)) for r in range(num_rows)}
    dense_v = {r: np.zeros((0, kd)) for r in range(num_rows)}
    scale = 1.0 / np.sqrt(hd)
    steps = [
        [(0, range(0, 2 * page_size + 1)), (1, range(0, 3))],  # two prefills, row 0 across pages
        [(1, range(3, 5)), (0, [2 * page_size + 1]), (2, range(0, 1))],  # chunk, decode, a new row
        [(2, [1]), (0, [2 * page_size + 2]), (1, [5])],  # decode everyone
    ]
    for step in steps:
        rows, positions, q, k, v = packed_step(rng, step, qd, kd)
        tokens = len(rows)
        kernel("kv_write")(k, v, rows, positions, page_table, LAYER, k_cache, v_cache)
        for t in range(tokens - 1):
            r, p = rows[t], positions[t]
            assert len(dense_k[r]) == p
            dense_k[r] = np.vstack([dense_k[r], k[t]])
            dense_v[r] = np.vstack([dense_v[r], v[t]])
        o = np.full((tokens, qd), 9.0, np.float32)
        kernel("paged_attention")(q, rows, positions, page_table, k_cache, v_cache, LAYER, heads, kv_heads,
                                  np.float32(scale), o)
        for t in range(tokens - 1):
            r, p = rows[t], positions[t]
            want = dense_attention(q[t].astype(np.float64), dense_k[r][:p + 1], dense_v[r][:p + 1], heads, kv_heads,
                                   scale)
            np.testing.assert_allclose(o[t], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(o[-1], 0.0)  # the padding token attends to nothing
    assert not k_cache[:, 0].any() and not v_cache[:, 0].any()  # only layer LAYER was written
    for r in range(num_rows):  # every written position sits at page_table[r, p // S], slot p % S
        for p in range(len(dense_k[r])):
            page = page_table[r, p // page_size]
            np.testing.assert_array_equal(k_cache[page, LAYER, p % page_size], dense_k[r][p].astype(np.float32))


def test_kv_write_skips_missing_pages(kernel, rng):
    k = rng.standard_normal((3, 8)).astype(np.float32)
    cache_k = np.zeros((2, 1, 4, 8), np.float32)
    cache_v = np.zeros_like(cache_k)
    page_table = np.array([[1, -1], [5, 0]], np.int32)  # row 1's first page id is out of range
    rows = np.array([0, 0, 1], np.int32)
    positions = np.array([1, 4, 0], np.int32)  # row 0 position 4 has no page
    kernel("kv_write")(k, k, rows, positions, page_table, 0, cache_k, cache_v)
    np.testing.assert_array_equal(cache_k[1, 0, 1], k[0])
    assert np.count_nonzero(cache_k) == 8


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "h{}-kv{}-d{}-s{}".format(*c))
def test_rope_kv_write_is_rope_then_kv_write_bit_for_bit(kernel, rng, config):
    """The fused RoPE + cache write from [q | k | v] leaves q and both caches exactly as
    rope_interleaved on q and k followed by kv_write do, in a packed step with a prefill chunk across pages,
    decode tokens, a padding token and a token whose page is missing."""
    heads, kv_heads, hd, page_size = config
    qd, kd = heads * hd, kv_heads * hd
    num_rows, pages_per_row, num_pages = 3, 3, 12
    page_table = rng.permutation(num_pages)[:num_rows * pages_per_row].reshape(num_rows, pages_per_row)
    page_table = page_table.astype(np.int32)
    page_table[2, 1] = -1  # row 2's second page is missing
    step = [(0, range(0, page_size + 3)), (1, [2 * page_size]), (2, [page_size + 1, 1])]
    rows, positions, q, k, v = packed_step(rng, step, qd, kd, padding_position=5)
    cache_shape = (num_pages, LAYERS, page_size, kd)
    k_cache, v_cache = rng.standard_normal(cache_shape).astype(np.float32), rng.standard_normal(cache_shape).astype(np.float32)

    q_apart, k_apart = q.copy(), k.copy()
    k_cache_apart, v_cache_apart = k_cache.copy(), v_cache.copy()
    kernel("rope_interleaved")(q_apart, positions, heads, 10000.0)
    kernel("rope_interleaved")(k_apart, positions, kv_heads, 10000.0)
    kernel("kv_write")(k_apart, v, rows, positions, page_table, LAYER, k_cache_apart, v_cache_apart)

    qkv = np.concatenate([q, k, v], axis=1)
    qkv_before = qkv.copy()
    q_out = np.full_like(q, np.nan)
    kernel("rope_kv_write")(qkv, rows, positions, page_table, LAYER, heads, kv_heads, np.float32(10000.0), q_out,
                            k_cache, v_cache)
    np.testing.assert_array_equal(q_out, q_apart)
    np.testing.assert_array_equal(k_cache, k_cache_apart)
    np.testing.assert_array_equal(v_cache, v_cache_apart)
    np.testing.assert_array_equal(qkv, qkv_before)  # k is read, not rotated in place

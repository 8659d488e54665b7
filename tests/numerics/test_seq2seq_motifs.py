"""std:seq2seq.loom and argmax_suppressed against numpy references, at odd shapes."""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_encoder_attention_as_split_bmm_softmax_merge(kernel, rng):
    batch, frames, heads, e = 2, 7, 3, 5
    d = heads * e
    qkv = rng.standard_normal((batch * frames, 3 * d)).astype(np.float32)
    g = batch * heads
    q, k = np.zeros((g, frames, e), np.float32), np.zeros((g, frames, e), np.float32)
    vt = np.zeros((g, e, frames), np.float32)
    kernel("split_heads")(qkv, heads, q, k, vt)
    scores = np.einsum("gse,gte->gst", q, k).astype(np.float32)
    kernel("softmax_scaled")(scores, np.float32(0.4))
    o = np.einsum("gst,get->gse", scores, vt).astype(np.float32)
    y = np.zeros((batch * frames, d), np.float32)
    kernel("merge_heads")(o, heads, y)
    want = np.zeros_like(y)
    for b in range(batch):
        rows = qkv[b * frames:(b + 1) * frames]
        for h in range(heads):
            qh, kh, vh = (rows[:, part * d + h * e:part * d + (h + 1) * e] for part in range(3))
            want[b * frames:(b + 1) * frames, h * e:(h + 1) * e] = softmax(0.4 * qh @ kh.T) @ vh
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6)


def test_merge_heads_writes_every_element(kernel, rng):
    # columns past heads * E and heads past the last group are zeros, whatever y held
    heads, s_len, e = 3, 5, 4
    o = rng.standard_normal((2 * heads - 1, s_len, e)).astype(np.float32)   # the second row block lacks a head
    y = np.full((2 * s_len, heads * e + 3), np.nan, np.float32)
    kernel("merge_heads")(o, heads, y)
    want = np.zeros_like(y)
    for g in range(2 * heads - 1):
        b, h = divmod(g, heads)
        want[b * s_len:(b + 1) * s_len, h * e:(h + 1) * e] = o[g]
    np.testing.assert_array_equal(y, want)


def test_softmax_exp_is_within_a_few_ulp(kernel, rng):
    s = (rng.standard_normal((2, 3, 301)) * 30).astype(np.float32)
    got = s.copy()
    kernel("softmax_scaled")(got, np.float32(1.0))
    want = softmax(s.astype(np.float64))
    assert np.max(np.abs(got - want) / np.maximum(want, 1e-30)) < 1e-5
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)


def test_decoder_rows_attend_to_their_own_caches(kernel, rng):
    heads, e, layers, positions, slots_n = 2, 4, 2, 9, 3
    d = heads * e
    # step: row 0 (slot 2) feeds positions 0..2, row 1 (slot 0) feeds position 5 after 0..4 are cached
    rows = np.array([0, 0, 0, 1], np.int32)
    pos = np.array([0, 1, 2, 5], np.int32)
    slots = np.array([2, 0], np.int32)
    cache_k = np.zeros((slots_n, layers, positions, d), np.float32)
    cache_v = np.zeros_like(cache_k)
    cache_k[0, 1, :5] = rng.standard_normal((5, d))
    cache_v[0, 1, :5] = rng.standard_normal((5, d))
    qkv = rng.standard_normal((4, 3 * d)).astype(np.float32)
    kernel("row_cache_write")(qkv, rows, slots, pos, 1, cache_k, cache_v)
    np.testing.assert_array_equal(cache_k[2, 1, :3], qkv[:3, d:2 * d])
    np.testing.assert_array_equal(cache_v[0, 1, 5], qkv[3, 2 * d:])
    o = np.zeros((4, d), np.float32)
    kernel("row_self_attention")(qkv, rows, slots, pos, cache_k, cache_v, 1, heads, np.float32(0.5), o)
    for t in range(4):
        n, p = slots[rows[t]], pos[t]
        for h in range(heads):
            sl = slice(h * e, (h + 1) * e)
            w = softmax(0.5 * cache_k[n, 1, :p + 1, sl] @ qkv[t, sl])
            np.testing.assert_allclose(o[t, sl], w @ cache_v[n, 1, :p + 1, sl], rtol=1e-5, atol=1e-6)


def test_cross_attention_over_each_rows_encoding(kernel, rng):
    heads, e, layers, frames, batch = 3, 4, 2, 11, 2
    d = heads * e
    kv = rng.standard_normal((batch * frames, 2 * d)).astype(np.float32)
    cross_k = np.zeros((4, layers, frames, d), np.float32)
    cross_v = np.zeros_like(cross_k)
    kernel("cross_kv_write")(kv, np.array([3, 1], np.int32), 0, cross_k, cross_v)
    np.testing.assert_array_equal(cross_k[3, 0], kv[:frames, :d])
    np.testing.assert_array_equal(cross_v[1, 0], kv[frames:, d:])
    q = rng.standard_normal((3, d)).astype(np.float32)
    rows, slots = np.array([1, 0, 1], np.int32), np.array([3, 1], np.int32)
    o = np.zeros((3, d), np.float32)
    kernel("row_cross_attention")(q, rows, slots, cross_k, cross_v, 0, heads, np.float32(0.3), o)
    for t in range(3):
        n = slots[rows[t]]
        for h in range(heads):
            sl = slice(h * e, (h + 1) * e)
            w = softmax(0.3 * cross_k[n, 0, :, sl] @ q[t, sl])
            np.testing.assert_allclose(o[t, sl], w @ cross_v[n, 0, :, sl], rtol=1e-5, atol=1e-6)


def test_f16_embedding_with_positions(kernel, rng):
    table = rng.standard_normal((10, 6)).astype(np.float16)
    pos = rng.standard_normal((8, 6)).astype(np.float32)
    tokens, positions = np.array([3, 9, 12, 0], np.int32), np.array([0, 7, 1, 9], np.int32)
    x = np.full((4, 6), np.nan, np.float32)
    kernel("embed_f16_positioned")(table, pos, tokens, positions, x)
    np.testing.assert_array_equal(x[:2], table[[3, 9]].astype(np.float32) + pos[[0, 7]])
    np.testing.assert_array_equal(x[2:], 0.0)                 # id 12 and position 9 are outside


def test_residual_add_bias_adds_the_biased_projection(kernel, rng):
    x, y, b = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32), \
        rng.standard_normal(5).astype(np.float32)
    want = x + (y + b)
    kernel("residual_add_bias")(x, y, b)
    np.testing.assert_array_equal(x, want)


def test_argmax_suppressed(kernel, rng):
    logits = rng.standard_normal((3, 20)).astype(np.float32)
    logits[:, 7] = 10.0
    logits[:, 4] = 9.0
    suppress, begin_only = np.array([7, 99], np.int32), np.array([4], np.int32)
    nxt = np.zeros(3, np.int32)
    kernel("argmax_suppressed")(logits.copy(), suppress, begin_only, np.array([0, 1, 0], np.int32), nxt)
    masked = logits.copy()
    masked[:, 7] = -np.inf
    masked[1, 4] = -np.inf
    np.testing.assert_array_equal(nxt, masked.argmax(axis=1))


def test_matvec_over_row_blocks_gives_the_bits_of_matmul_f16(kernel, rng):
    # every output one fma chain over k from +0.0, whatever the number of rows (whole groups of
    # 4, a remainder of 1-3) and past the last whole block of 32 outputs
    from loomc.lower import matmul

    k_dim, n = 45, 70
    w = rng.standard_normal((n, k_dim)).astype(np.float16)
    nb = -(-n // 32)
    wb = np.zeros((nb, k_dim, 32), np.float16)
    kernel("block_rows_f16")(w, wb)
    gemm = matmul.load_function("matmul_f16")
    for rows in (1, 2, 3, 4, 5, 7, 8):
        x = rng.standard_normal((rows, k_dim)).astype(np.float32)
        y = np.full((rows, n), np.nan, np.float32)
        kernel("matvec_f16b")(x, wb, y)
        want = np.zeros((1, rows, n), np.float32)
        gemm(x[None], w.view(np.uint16)[None], want,
             np.zeros(max(matmul.workspace_elems("matmul_f16", 1, rows, k_dim, n), 1), np.float32))
        np.testing.assert_array_equal(y, want[0])

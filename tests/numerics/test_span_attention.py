"""std:attention.loom's span_attention (the encoders' attention: vectors, the illustrator's
text encoder, the speaker's text encoders and OOV network) and the two kernels that give its
spans, std:encoders.loom's packed_spans and std:speech.loom's row_spans: softmax(q k^T s) v
over each token's span against torch, spans longer than one chunk (row_chunk = 32) and not a
multiple of its 8 chains, empty or out-of-pack spans as zero rows, and a token's row the same
bits whatever else shares the call."""

from __future__ import annotations

import numpy as np
import torch


def reference(qkv: np.ndarray, first: np.ndarray, count: np.ndarray, heads: int, scale: float) -> np.ndarray:
    t, d3 = qkv.shape
    d = d3 // 3
    hd = d // heads
    x = torch.from_numpy(qkv.astype(np.float64))
    out = torch.zeros(t, d, dtype=torch.float64)
    for i in range(t):
        lo, n = int(first[i]), int(count[i])
        if n <= 0 or lo < 0 or lo + n > t:
            continue
        for h in range(heads):
            q = x[i, h * hd:(h + 1) * hd]
            k = x[lo:lo + n, d + h * hd:d + (h + 1) * hd]
            v = x[lo:lo + n, 2 * d + h * hd:2 * d + (h + 1) * hd]
            out[i, h * hd:(h + 1) * hd] = torch.softmax(k @ q * scale, 0) @ v
    return out.numpy()


def spans_of(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    first = np.concatenate([np.full(n, s) for s, n in zip(np.cumsum([0] + lengths[:-1]), lengths)]).astype(np.int32)
    count = np.concatenate([np.full(n, n) for n in lengths]).astype(np.int32)
    return first, count


def test_span_attention_matches_softmax_over_each_span(kernel, rng):
    lengths, heads, d = [1, 7, 8, 33, 70], 3, 24   # one token, under a chain group, one group, a chunk + 1, 2 chunks + 6
    t = sum(lengths)
    qkv = rng.standard_normal((t, 3 * d)).astype(np.float32)
    first, count = spans_of(lengths)
    out = np.full((t, d), np.nan, np.float32)
    kernel("span_attention")(qkv, first, count, heads, np.float32(0.3), out)
    np.testing.assert_allclose(out, reference(qkv, first, count, heads, 0.3), rtol=2e-5, atol=2e-6)


def test_empty_and_out_of_pack_spans_give_zero_rows(kernel, rng):
    t, heads, d = 10, 2, 8
    qkv = rng.standard_normal((t, 3 * d)).astype(np.float32)
    first = np.array([0, 0, 0, 0, -1, 8, 8, 3, 3, 3], np.int32)
    count = np.array([4, 4, 4, 4, 2, 5, 0, 3, 3, 3], np.int32)   # token 4 starts before the pack, 5 ends past it, 6 is empty
    out = np.full((t, d), np.nan, np.float32)
    kernel("span_attention")(qkv, first, count, heads, np.float32(0.5), out)
    np.testing.assert_array_equal(out[4:7], 0.0)
    np.testing.assert_allclose(out, reference(qkv, first, count, heads, 0.5), rtol=2e-5, atol=2e-6)


def test_a_tokens_row_is_the_same_bits_whatever_shares_the_call(kernel, rng):
    heads, d = 2, 16
    alone = rng.standard_normal((41, 3 * d)).astype(np.float32)
    other = rng.standard_normal((9, 3 * d)).astype(np.float32)
    f1, c1 = spans_of([41])
    out1 = np.zeros((41, d), np.float32)
    kernel("span_attention")(alone, f1, c1, heads, np.float32(0.25), out1)
    packed = np.concatenate([other, alone])
    f2, c2 = spans_of([9, 41])
    out2 = np.zeros((50, d), np.float32)
    kernel("span_attention")(packed, f2, c2, heads, np.float32(0.25), out2)
    np.testing.assert_array_equal(out2[9:], out1)


def test_packed_spans_follow_the_sequence_table(kernel):
    seq = np.array([1, 1, 0, 0, 0, -1, 2, 7], np.int32)   # sequences in any order; -1 and 7 are padding
    starts, lengths = np.array([2, 0, 6], np.int32), np.array([3, 2, 1], np.int32)
    first, count = np.full(8, 99, np.int32), np.full(8, 99, np.int32)
    kernel("packed_spans")(seq, starts, lengths, first, count)
    np.testing.assert_array_equal(first, [0, 0, 2, 2, 2, 0, 6, 0])
    np.testing.assert_array_equal(count, [2, 2, 3, 3, 3, 0, 1, 0])


def test_row_spans_are_each_positions_contiguous_row(kernel):
    rows = np.array([0, 0, 0, 1, 2, 2, 5, 5, 5, 5], np.int32)
    first, count = np.zeros(10, np.int32), np.zeros(10, np.int32)
    kernel("row_spans")(rows, first, count)
    np.testing.assert_array_equal(first, [0, 0, 0, 3, 4, 4, 6, 6, 6, 6])
    np.testing.assert_array_equal(count, [3, 3, 3, 1, 2, 2, 4, 4, 4, 4])

"""Row gathers and embedding lookups (f32 and q8_0 tables), including out-of-range ids."""

import numpy as np
import pytest
from numerics_testlib import dequantized, quantized


@pytest.mark.parametrize("rows,tokens,width", [(1, 1, 3), (3, 7, 64), (4, 9, 97)])
def test_gather_last(kernel, rng, rows, tokens, width):
    x = rng.standard_normal((tokens, width)).astype(np.float32)
    index = rng.integers(0, tokens, rows).astype(np.int32)
    index[0] = -1 if rows > 1 else index[0]  # a row with no token this step gives zeros
    y = np.full((rows, width), 7.0, np.float32)
    kernel("gather_last")(x, index, y)
    want = np.where((index >= 0)[:, None], x[np.clip(index, 0, None)], 0.0)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("placed,tokens,width", [(0, 3, 5), (1, 1, 3), (5, 9, 97)])
def test_place_rows(kernel, rng, placed, tokens, width):
    rows = rng.standard_normal((placed, width)).astype(np.float32)
    at = rng.permutation(tokens + 2)[:placed].astype(np.int32) - 1   # distinct, some outside 0..T
    x = rng.standard_normal((tokens, width)).astype(np.float32)
    want = x.copy()
    for e, i in enumerate(at):
        if 0 <= i < tokens:
            want[i] = rows[e]
    kernel("place_rows")(rows, at, x)
    np.testing.assert_array_equal(x, want)   # the rest of x untouched; E = 0 places nothing


@pytest.mark.parametrize("vocab,tokens,width", [(5, 1, 3), (50, 7, 64), (33, 12, 97)])
def test_embed_f32(kernel, rng, vocab, tokens, width):
    table = rng.standard_normal((vocab, width)).astype(np.float32)
    ids = rng.integers(-2, vocab + 2, tokens).astype(np.int32)
    y = np.full((tokens, width), 7.0, np.float32)
    kernel("embed_f32")(table, ids, y)
    valid = (ids >= 0) & (ids < vocab)
    want = np.where(valid[:, None], table[np.clip(ids, 0, vocab - 1)], 0.0)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("vocab,tokens,width", [(5, 1, 32), (50, 7, 64), (33, 12, 96)])
def test_embed_q8_0(kernel, rng, vocab, tokens, width):
    blocks, table = quantized(rng, "q8_0", vocab, width)
    ids = rng.integers(-2, vocab + 2, tokens).astype(np.int32)
    ids[0] = vocab - 1
    y = np.full((tokens, width), 7.0, np.float32)
    kernel("embed_q8_0")(blocks, ids, y)
    valid = (ids >= 0) & (ids < vocab)
    want = np.where(valid[:, None], table[np.clip(ids, 0, vocab - 1)], 0.0)
    np.testing.assert_array_equal(y, want)  # d * q in f32: exactly gguf's dequantization
    np.testing.assert_array_equal(dequantized("q8_0", blocks), table)

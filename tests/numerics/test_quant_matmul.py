"""Matmuls over GGUF blocks read in place, against gguf's dequantize followed by numpy matmul."""

import numpy as np
import pytest
from numerics_testlib import dequantized, quantized, random_blocks

SHAPES = [(1, 5, 32), (3, 17, 64), (4, 33, 96), (2, 64, 576)]  # (tokens, out features, in features)


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_matches_dequantized_weights(kernel, rng, qtype, shape):
    t_count, n, k = shape
    blocks, w = quantized(rng, qtype, n, k)
    x = rng.standard_normal((t_count, k)).astype(np.float32)
    y = np.zeros((t_count, n), np.float32)
    kernel(f"matmul_{qtype}")(x, blocks, y)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0"])
def test_matmul_on_hand_built_blocks(kernel, rng, qtype):
    """Random codes (every nibble/byte value) and f16 scales, including negative mins."""
    blocks = random_blocks(rng, qtype, (7, 128), scale=0.5)
    w = dequantized(qtype, blocks)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    y = np.zeros((3, 7), np.float32)
    kernel(f"matmul_{qtype}")(x, blocks, y)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0"])
def test_matmul_is_deterministic_and_batch_independent(kernel, rng, qtype):
    """A token's output does not depend on the other tokens of the batch, nor an output
    row on the other rows: 9 tokens x 41 rows run as whole 4 x 2 tiles, a last odd row
    and a last token alone, and each must give what that token or row gives alone."""
    blocks, _ = quantized(rng, qtype, 41, 96)
    x = rng.standard_normal((9, 96)).astype(np.float32)
    y_all = np.zeros((9, 41), np.float32)
    kernel(f"matmul_{qtype}")(x, blocks, y_all)
    for t in range(9):
        y_one = np.zeros((1, 41), np.float32)
        kernel(f"matmul_{qtype}")(x[t:t + 1].copy(), blocks, y_one)
        np.testing.assert_array_equal(y_one[0], y_all[t])
    for n in range(41):
        y_row = np.zeros((9, 1), np.float32)
        kernel(f"matmul_{qtype}")(x, blocks[n:n + 1].copy(), y_row)
        np.testing.assert_array_equal(y_row[:, 0], y_all[:, n])

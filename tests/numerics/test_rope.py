"""Rotary position embedding, both pair layouts, against a float64 numpy rotation."""

import numpy as np
import pytest

SHAPES = [(1, 1, 2), (3, 4, 16), (5, 3, 10), (4, 9, 64)]  # (tokens, heads, head_dim)


def reference(x, positions, heads, base, interleaved):
    t_count, width = x.shape
    hd = width // heads
    out = x.astype(np.float64).copy()
    i = np.arange(hd // 2)
    for t in range(t_count):
        theta = positions[t] * base ** (-2.0 * i / hd)
        c, s = np.cos(theta), np.sin(theta)
        for h in range(heads):
            head = out[t, h * hd:(h + 1) * hd]
            a, b = (head[0::2].copy(), head[1::2].copy()) if interleaved else (head[:hd // 2].copy(), head[hd // 2:].copy())
            ra, rb = a * c - b * s, a * s + b * c
            if interleaved:
                head[0::2], head[1::2] = ra, rb
            else:
                head[:hd // 2], head[hd // 2:] = ra, rb
    return out


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
@pytest.mark.parametrize("shape", SHAPES)
def test_rope(kernel, rng, shape, interleaved):
    t_count, heads, hd = shape
    x = rng.standard_normal((t_count, heads * hd)).astype(np.float32)
    positions = rng.integers(0, 500, t_count).astype(np.int32)
    want = reference(x, positions, heads, 10000.0, interleaved)
    kernel("rope_interleaved" if interleaved else "rope_half")(x, positions, heads, 10000.0)
    np.testing.assert_allclose(x, want, rtol=1e-4, atol=2e-4)


def test_rope_position_zero_is_identity(kernel, rng):
    x = rng.standard_normal((2, 32)).astype(np.float32)
    before = x.copy()
    kernel("rope_interleaved")(x, np.zeros(2, np.int32), 2, 100000.0)
    np.testing.assert_array_equal(x, before)

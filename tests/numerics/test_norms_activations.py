"""Norms, activations and the residual update against numpy references (float64, then compared)."""

import math

import numpy as np
import pytest

SHAPES = [(1, 7), (3, 64), (5, 97), (2, 576)]


def rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm(kernel, rng, shape):
    x, w = rand(rng, shape, 3.0), rand(rng, shape[-1:])
    y = np.zeros_like(x)
    kernel("rmsnorm")(x, w, 1e-5, y)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_layernorm(kernel, rng, shape):
    x = rand(rng, shape, 2.0) + 100.0  # a large mean: the two-pass variance must not cancel
    w, b = rand(rng, shape[-1:]), rand(rng, shape[-1:])
    y = np.zeros_like(x)
    kernel("layernorm")(x, w, b, 1e-5, y)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=1, keepdims=True)
    want = (x64 - mean) / np.sqrt(var + 1e-5) * w + b
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def _erf(v):
    return np.vectorize(math.erf)(v)


ACTIVATIONS = {
    "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu_erf": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_activation(kernel, rng, name, shape):
    x = rand(rng, shape, 4.0)
    x.flat[0] = -90.0  # exp overflows in sigmoid's denominator: silu must give -0, not nan
    y = np.zeros_like(x)
    kernel(name)(x, y)
    want = ACTIVATIONS[name](x.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_swiglu(kernel, rng, shape):
    gate, up = rand(rng, shape, 3.0), rand(rng, shape, 3.0)
    y = np.zeros_like(gate)
    kernel("swiglu")(gate, up, y)
    g = gate.astype(np.float64)
    np.testing.assert_allclose(y, g / (1 + np.exp(-g)) * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_swiglu_fused_is_swiglu_on_the_halves(kernel, rng, shape):
    gate, up = rand(rng, shape, 3.0), rand(rng, shape, 3.0)
    want, y = np.zeros_like(gate), np.full_like(gate, np.nan)
    kernel("swiglu")(gate, up, want)
    kernel("swiglu_fused")(np.concatenate([gate, up], axis=-1), y)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_residual_add_in_place(kernel, rng, shape):
    x, r = rand(rng, shape), rand(rng, shape)
    want = x + r
    kernel("residual_add")(x, r)
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("shape", SHAPES)
def test_residual_rmsnorm_is_residual_add_then_rmsnorm_bit_for_bit(kernel, rng, shape):
    x, r, w = rand(rng, shape, 3.0), rand(rng, shape), rand(rng, shape[-1:])
    x_apart, y_apart = x.copy(), np.zeros_like(x)
    kernel("residual_add")(x_apart, r)
    kernel("rmsnorm")(x_apart, w, 1e-5, y_apart)
    y = np.full_like(x, np.nan)
    kernel("residual_rmsnorm")(x, r, w, 1e-5, y)
    np.testing.assert_array_equal(x, x_apart)
    np.testing.assert_array_equal(y, y_apart)

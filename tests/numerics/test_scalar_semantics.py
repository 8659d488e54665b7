"""The numba renderer implements the IR's scalar semantics: wrapping, C division, conversions,
f16/bf16 rounding, bitcasts, min/max, fma, exp; and multi-loop kernels run their parts in order."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from loomc.check import load_files
from loomc.run.compile import compile_kernel
from numerics_testlib import AVX2, AVX512, BASELINE, assert_same_bits_in_classes, host_has

FIXTURE = Path(__file__).parent / "fixtures" / "semantics.loom"


@pytest.fixture(scope="module")
def k():
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    return lambda name: compile_kernel(checked, name)


def c_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def test_i32(k, rng):
    a = rng.integers(-2 ** 31, 2 ** 31, 200, dtype=np.int64).astype(np.int32)
    b = rng.integers(-50, 50, 200).astype(np.int32)
    b[b == 0] = 7
    a[:4] = [-7, 7, -2 ** 31, 5]
    b[:4] = [2, -2, -1, 0]
    outs = [np.zeros(200, np.int32) for _ in range(5)]
    k("i32_ops")(a, b, *outs)
    q, r, m, s, w = outs
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    safe = b64 != 0
    want_q = np.where(safe, c_div(a64, np.where(safe, b64, 1)), 0)
    want_q[2] = -2 ** 31  # INT_MIN / -1 wraps
    np.testing.assert_array_equal(q[:2], [-3, -3])
    np.testing.assert_array_equal(q[3:], want_q[3:].astype(np.int32))
    np.testing.assert_array_equal(r[:2], [-1, 1])
    np.testing.assert_array_equal(r[4:], (a64 - b64 * want_q)[4:].astype(np.int32))
    assert q[3] == 0 and r[3] == 0  # division by zero yields 0 instead of trapping
    np.testing.assert_array_equal(m, (a64 * b64).astype(np.int32))
    np.testing.assert_array_equal(s, a >> 3)
    np.testing.assert_array_equal(w, (a64 + 2147483647).astype(np.int32))


def test_u32(k, rng):
    a = rng.integers(0, 2 ** 32, 300, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(1, 2 ** 32, 300, dtype=np.uint64).astype(np.uint32)
    outs = [np.zeros(300, np.uint32) for _ in range(7)]
    k("u32_ops")(a, b, *outs)
    add, mul, shl, shr, neg, inv, div = outs
    a64, b64 = a.astype(np.uint64), b.astype(np.uint64)
    np.testing.assert_array_equal(add, ((a64 + b64) & 0xFFFFFFFF).astype(np.uint32))
    np.testing.assert_array_equal(mul, ((a64 * b64) & 0xFFFFFFFF).astype(np.uint32))
    np.testing.assert_array_equal(shl, ((a64 << (b64 & 31)) & 0xFFFFFFFF).astype(np.uint32))
    np.testing.assert_array_equal(shr, (a64 >> (b64 & 31)).astype(np.uint32))
    np.testing.assert_array_equal(neg, ((2 ** 32 - a64) & 0xFFFFFFFF).astype(np.uint32))
    np.testing.assert_array_equal(inv, ~a)
    np.testing.assert_array_equal(div, a // b)


def test_i8_wraps(k, rng):
    a = rng.integers(-128, 128, 256).astype(np.int8)
    b = rng.integers(-128, 128, 256).astype(np.int8)
    outs = [np.zeros(256, np.int8) for _ in range(3)]
    k("i8_ops")(a, b, *outs)
    a16, b16 = a.astype(np.int16), b.astype(np.int16)
    for got, want in zip(outs, (a16 + b16, a16 * b16, a16 - b16)):
        np.testing.assert_array_equal(got, want.astype(np.int8))


def test_u64_mix_matches_python_integers(k, rng):
    a = rng.integers(0, 2 ** 63, 50, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = rng.integers(0, 2 ** 63, 50, dtype=np.uint64)
    y = np.zeros(50, np.uint64)
    k("u64_mix")(a, b, y)
    mask = 2 ** 64 - 1
    for i in range(50):
        z = (int(a[i]) + int(b[i]) * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        assert int(y[i]) == z ^ (z >> 31)


def test_conversions(k):
    x = np.array([2.9, -2.9, 0.5, -0.5, 1e9, -7.0], np.float32)
    kk = np.array([300, -129, 0, 2 ** 40 + 5, -1, 1], np.int64)
    t, n, f, b = np.zeros(6, np.int32), np.zeros(6, np.int8), np.zeros(6, np.float32), np.zeros(6, np.bool_)
    k("conversions")(x, kk, t, n, f, b)
    assert t.tolist() == [2, -2, 0, 0, 1000000000, -7]
    np.testing.assert_array_equal(n, kk.astype(np.int8))
    np.testing.assert_array_equal(f, kk.astype(np.float32))
    assert b.tolist() == [True, True, False, True, True, True]


def test_every_f16_converts_exactly(k):
    x = np.arange(2 ** 16, dtype=np.uint16).view(np.float16)
    y, back = np.zeros(2 ** 16, np.float32), np.zeros(2 ** 16, np.float16)
    k("half_in")(x, y, back)
    want = x.astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(y.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    assert np.isnan(y[nan]).all()
    np.testing.assert_array_equal(back.view(np.uint16)[~nan], x.view(np.uint16)[~nan])
    assert np.isnan(back[nan]).all()


def nearest_bf16(x: np.ndarray) -> np.ndarray:
    """bf16 bits by exhaustive comparison of the two neighbours (ties to even)."""
    bits = x.view(np.uint32).astype(np.uint64)
    lo = bits & 0xFFFF0000
    hi = lo + 0x10000
    lo_v = lo.astype(np.uint32).view(np.float32).astype(np.float64)
    hi_v = (hi & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)
    xv = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        d_lo, d_hi = np.abs(xv - lo_v), np.abs(hi_v - xv)
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (((lo >> 16) & 1) == 1))
    return np.where(pick_hi, hi, lo).astype(np.uint64) >> 16


def test_f32_to_f16_and_bf16_round_to_nearest_even(k, rng):
    x = np.concatenate([
        rng.standard_normal(4000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 4000).astype(np.float32),
        np.array([65504, 65519.99, 65520, 1e6, -1e6, 6e-8, 2.98e-8, 3e-8, 0.0, -0.0, np.inf, -np.inf], np.float32),
        (np.arange(1, 2048, dtype=np.float32) * np.float32(2 ** -24)),  # the f16 subnormal range
    ]).astype(np.float32)
    h, b, bb = np.zeros(len(x), np.float16), np.zeros(len(x), np.uint16), np.zeros(len(x), np.float32)
    k("half_out")(x, h, b, bb)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h.view(np.uint16), x.astype(np.float16).view(np.uint16))
    finite = np.isfinite(x)
    np.testing.assert_array_equal(b[finite], nearest_bf16(x[finite]).astype(np.uint16))
    np.testing.assert_array_equal(bb, (b.astype(np.uint32) << 16).view(np.float32))


def test_f16_arithmetic_rounds_each_op(k, rng):
    a = rng.standard_normal(500).astype(np.float16)
    c = (rng.standard_normal(500) * 30).astype(np.float16)
    y = np.zeros(500, np.float16)
    k("half_math")(a, c, y)
    np.testing.assert_array_equal(y, (a * c) + a)  # numpy rounds f16 ops the same way


def test_bitcasts(k, rng):
    x = rng.standard_normal(100).astype(np.float32)
    u, back, h = np.zeros(100, np.uint32), np.zeros(100, np.float32), np.zeros(100, np.uint16)
    k("bits")(x, u, back, h)
    np.testing.assert_array_equal(u, x.view(np.uint32))
    np.testing.assert_array_equal(back, x)
    np.testing.assert_array_equal(h, x.astype(np.float16).view(np.uint16))


def test_min_max_fma_fmod(k):
    a = np.array([1.0, np.nan, 3.0, -2.0, 1.0 + 2 ** -23, 7.5], np.float32)
    b = np.array([np.nan, 2.0, 3.0, 5.0, 1.0 - 2 ** -23, -2.0], np.float32)
    lo, hi, f, m = (np.zeros(6, np.float32) for _ in range(4))
    k("float_ops")(a, b, lo, hi, f, m)
    np.testing.assert_array_equal(lo[[0, 2, 3]], [1.0, 3.0, -2.0])
    assert np.isnan(lo[1]) and np.isnan(hi[1]) and hi[0] == 1.0 and hi[3] == 5.0
    want_fma = (a.astype(np.float64) * b.astype(np.float64) - a.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(f[[2, 3, 4, 5]], want_fma[[2, 3, 4, 5]])  # one rounding: -2^-46 survives
    assert f[4] != np.float32(a[4] * b[4]) - a[4]
    np.testing.assert_array_equal(m[[2, 3, 5]], np.fmod(a, b)[[2, 3, 5]])


def test_phases_run_in_order(k, rng):
    x = rng.standard_normal(37).astype(np.float32)
    y, total = np.zeros(37, np.float32), np.zeros(1, np.float32)
    launcher = k("phases")
    assert len(launcher.functions) == 3
    launcher(x, y, total)
    np.testing.assert_allclose(total[0], (2 * x.astype(np.float64)).sum(), rtol=1e-5)
    np.testing.assert_allclose(y, 2 * x - total[0], rtol=1e-6, atol=1e-6)


def test_local_arrays_start_zeroed_for_every_lane(k):
    y, z = np.full((3, 4), -1, np.int64), np.zeros(3, np.float64)
    k("locals")(np.int32(10), y, z)
    counts = [sum(i for i in range(10) if i % 4 == j) for j in range(4)]
    np.testing.assert_array_equal(y, np.array(counts)[None, :] + np.arange(3)[:, None])
    np.testing.assert_array_equal(z, 5.0)


def exp_inputs() -> np.ndarray:
    """Uniform over exp's whole f32 range and past both ends, normal around 0, and the edges."""
    rng = np.random.default_rng(2026)
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 88.72283172607421875, 88.72283935546875,
             -87.33654022216797, -103.97207641601562, -103.9720840454101, 150.0, 151.0, -151.0, 1e30, -1e30]
    return np.concatenate([rng.uniform(-110, 95, 1_500_000), rng.standard_normal(500_000) * 4, edges]).astype(np.float32)


def run_exp(data: dict) -> dict:
    checked = load_files([FIXTURE])
    x, w = data["x"], data["w"]
    out = {"e": np.zeros_like(x), "s": np.zeros_like(x), "e64": np.zeros_like(w)}
    compile_kernel(checked, "exp_sigmoid")(x, out["e"], out["s"], w, out["e64"])
    return out


def test_exp_of_f32_is_the_correctly_rounded_exp_and_sigmoid_is_built_on_it(rng):
    x = exp_inputs()
    w = rng.standard_normal(x.size) * 20
    got = run_exp({"x": x, "w": w})
    with np.errstate(over="ignore"):
        correct = np.exp(x.astype(np.float64)).astype(np.float32)   # f64 exp rounded once: correct but for ties
        sigmoid = np.float32(1) / (np.float32(1) + np.exp((-x).astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(got["e"], correct)
    np.testing.assert_array_equal(got["s"], sigmoid)
    # f64: the C library's exp against numpy's, each within about an ulp, whatever the CPU
    np.testing.assert_allclose(got["e64"], np.exp(w), rtol=2e-15)


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                    reason="the SIMD classes compared here are x86-64's")
def test_exp_gives_the_same_bits_on_every_simd_class(tmp_path):
    classes = [BASELINE] + ([AVX2] if host_has("avx2") else []) + ([AVX512] if host_has("avx512bw") else [])
    x = exp_inputs()[::40].copy()
    data = {"x": x, "w": np.linspace(-700, 700, x.size)}
    assert_same_bits_in_classes(classes, "test_scalar_semantics:run_exp", data, run_exp(data), tmp_path)

"""Helpers for the numerics tests: GGUF blocks built with numpy, and checked references."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

QTYPES = {"q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
MOTIFS = Path(__file__).resolve().parents[2] / "loomc" / "motifs"

# NUMBA_CPU_NAME / NUMBA_CPU_FEATURES of SIMD classes that tests compile for in a subprocess.
BASELINE = ("x86-64", "+64bit,+sse,+sse2,+cx8,+fxsr,+mmx,+cmov")
AVX2 = ("haswell", "+64bit,+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+avx,+avx2,+fma,+f16c,+bmi,+bmi2,"
                   "+lzcnt,+movbe,+cx16,+cmov")
AVX512 = ("skylake-avx512", AVX2[1] + ",+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512cd")
# AVX-512 code tuned for AMD Zen 5, whose 512-bit shuffles are fast: some motifs take other
# instructions there (loomc/lower/qdot.py), always to the same bits
ZEN5 = ("znver5", AVX512[1])


_CLASS_CHILD = """
import importlib, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
module, function = sys.argv[2].split(":")
compute = getattr(importlib.import_module(module), function)
np.savez(sys.argv[4], **compute(dict(np.load(sys.argv[3]))))
"""


def assert_same_bits_in_classes(classes, compute: str, data: dict, here: dict, tmp_path: Path) -> None:
    """Run `compute` ("test_module:function", data dict -> dict of arrays) on `data` in a subprocess
    compiled for each (NUMBA_CPU_NAME, NUMBA_CPU_FEATURES) of `classes`; assert every array
    equals `here`'s bit for bit."""
    import json
    import os
    import subprocess
    import sys

    np.savez(tmp_path / "in.npz", **data)
    for cpu, features in classes:
        out = tmp_path / f"{cpu}.npz"
        env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features}
        run = subprocess.run([sys.executable, "-c", _CLASS_CHILD, str(Path(__file__).parent), compute,
                              str(tmp_path / "in.npz"), str(out)], env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        there = np.load(out)
        for name, value in here.items():
            np.testing.assert_array_equal(there[name], value, err_msg=json.dumps([cpu, name]))


def host_has(flag: str) -> bool:
    """Whether /proc/cpuinfo lists `flag` for this CPU (False where there is no such file)."""
    try:
        return any(flag in line.split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("flags"))
    except OSError:
        return False


def quantized(rng: np.random.Generator, qtype: str, rows: int, cols: int, scale: float = 1.0):
    """Random f32 weights quantized by gguf's reference quantizer: (GGUF bytes, dequantized f32)."""
    w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    blocks = quantize(w, QTYPES[qtype])
    return blocks, dequantize(blocks, QTYPES[qtype])


def random_blocks(rng: np.random.Generator, qtype: str, shape: tuple[int, ...], scale: float = 0.02) -> np.ndarray:
    """Valid GGUF blocks with random codes and small f16 scales (fast for big tensors)."""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    nb, bpb = cols // 32, BLOCK_BYTES[qtype]
    b = rng.integers(0, 256, (rows, nb, bpb), dtype=np.uint8)
    b[:, :, 0:2] = (rng.random((rows, nb)) * scale + scale / 4).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if qtype == "q4_1":
        b[:, :, 2:4] = (-rng.random((rows, nb)) * scale * 8).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    return b.reshape(shape[:-1] + (nb * bpb,))


def dequantized(qtype: str, blocks: np.ndarray) -> np.ndarray:
    return dequantize(blocks, QTYPES[qtype])


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def f32_nearest(x) -> np.float32:
    """An exact rational rounded once to the nearest f32 (ties to even), subnormals included."""
    from fractions import Fraction

    x = Fraction(x)
    if x == 0:
        return np.float32(0.0)
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()  # 2^e <= x < 2^(e+2)
    if x < Fraction(2) ** e:
        e -= 1
    quantum = Fraction(2) ** max(e - 23, -149)  # 24-bit significands; the subnormal step below 2^-126
    return np.float32(sign * float(round(x / quantum) * quantum))  # round() on a Fraction: ties to even


def fma_chain(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The `matmul` motif's contract computed exactly: c[m, n] = fma(a[m, k], b[n, k], c) for k
    in increasing order from +0.0, every step rounded once from the exact rational value."""
    from fractions import Fraction

    m_count, k_count = a.shape
    out = np.zeros((m_count, b.shape[0]), np.float32)
    rows = [[Fraction(float(v)) for v in row] for row in a]
    cols = [[Fraction(float(v)) for v in row] for row in b]
    for m in range(m_count):
        for n in range(len(cols)):
            acc = np.float32(0.0)
            for k in range(k_count):
                acc = f32_nearest(rows[m][k] * cols[n][k] + Fraction(float(acc)))
            out[m, n] = acc
    return out


def matmul_i8_reference(a: np.ndarray, w: np.ndarray, scale) -> np.ndarray:
    """The `matmul_i8` motif's contract in numpy (loomc/lower/i8gemm.py): each row of `a` (f32)
    quantized to uint8 as DynamicQuantizeLinear quantizes a tensor (a NaN left out of the
    range, code 0), exact int64 dots with the int8 `w[N, K]`, one conversion and one product."""
    f32 = np.float32
    a = np.asarray(a, f32)
    if a.shape[1] == 0:
        return np.zeros((a.shape[0], w.shape[0]), f32)
    lo = np.minimum(np.nanmin(a, 1), f32(0))
    hi = np.maximum(np.nanmax(a, 1), f32(0))
    s = (hi - lo) / f32(255)
    empty = s == 0
    step = np.where(empty, f32(1), s)
    zp = np.where(empty, f32(0), np.clip(np.rint(-lo / step), 0, 255))
    with np.errstate(invalid="ignore"):
        codes = np.nan_to_num(np.clip(np.rint(a / step[:, None]) + zp[:, None], 0, 255), nan=0.0).astype(np.int64)
    dots = (codes - zp.astype(np.int64)[:, None]) @ np.asarray(w, np.int64).T
    out = dots.astype(f32) * (s * f32(scale))[:, None]
    out[empty] = 0
    return out


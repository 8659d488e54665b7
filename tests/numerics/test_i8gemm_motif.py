"""The int8 matmul motif `matmul_i8`: the contract of loomc/lower/i8gemm.py bit for bit,
batch invariance, the packing kernel, every SIMD class.

The contract: each row of a is quantized as ONNX's DynamicQuantizeLinear quantizes a tensor
(lo = min(0, min), hi = max(0, max), s = (hi - lo) / 255, zp = clamp(rint(-lo / s)),
q = clamp(rint(a / s) + zp), all f32), then c = f32(sum (q - zp) w) * (s * scale) with an
exact integer sum. The reference is that in numpy, with int64 dots (numerics_testlib's
`matmul_i8_reference`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from loomc.check import load_files
from loomc.lower import i8gemm
from loomc.run.compile import compile_command
from numerics_testlib import AVX2, AVX512, BASELINE, assert_same_bits_in_classes, host_has, matmul_i8_reference

FIXTURE = Path(__file__).parent / "fixtures" / "i8gemm.loom"
# AVX-512 of 2017: no VNNI, so the tile is plain vector IR on zmm


def pack(w: np.ndarray) -> np.ndarray:
    """w[N, K] in the motif's panels: p[nb, kq, 4 l + j] = w[16 nb + l, 4 kq + j], zero past N, K."""
    n, k = w.shape
    nb, kq = i8gemm.panels_of(n, k)
    padded = np.zeros((nb * 16, kq * 4), np.int8)
    padded[:n, :k] = w
    return padded.reshape(nb, 16, kq, 4).transpose(0, 2, 1, 3).reshape(nb, kq, 64).copy()


def run_motif(a: np.ndarray, w: np.ndarray, scale: float) -> np.ndarray:
    m, k = a.shape
    n = w.shape[0]
    c = np.full((m, n), np.nan, np.float32)   # every element must be written
    workspace = np.zeros(i8gemm.workspace_elems(m, k, n), np.float32)
    i8gemm.load_function()(*i8gemm.launch_arguments("matmul_i8", [a, pack(w), np.array([scale], np.float32), c],
                                                    workspace))
    return c


def activations(rng, m: int, k: int) -> np.ndarray:
    a = (rng.standard_normal((m, k)) * rng.uniform(0.05, 4.0)).astype(np.float32)
    if m > 1:
        a[1] = 0.0                         # s = 0: a zero row
    if m > 2:
        a[2] = np.abs(a[2])                # lo = 0: zero point 0
    if m > 3:
        a[3] = -np.abs(a[3])               # hi = 0: zero point 255
    if m > 4 and k > 2:
        a[4, :3] = [0.5, -0.5, 1e-30]      # ties and a value far below a step
    return a


@pytest.mark.parametrize("m, k, n", [(1, 4, 16), (5, 13, 17), (7, 256, 64), (13, 910, 70), (30, 192, 384),
                                     (4, 0, 20), (0, 8, 16), (6, 3, 1), (61, 64, 200)])
def test_bits_equal_the_matmul_i8_reference(rng, m, k, n):
    a = activations(rng, m, k)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    np.testing.assert_array_equal(run_motif(a, w, 0.0123), matmul_i8_reference(a, w, np.float32(0.0123)))


def test_a_nan_is_left_out_of_the_range_and_reads_as_code_zero(rng):
    a = activations(rng, 3, 40)
    a[0, 7] = np.nan
    w = rng.integers(-128, 128, (20, 40), dtype=np.int8)
    c = run_motif(a, w, 0.5)
    assert np.isfinite(c).all()
    np.testing.assert_array_equal(c, matmul_i8_reference(a, w, np.float32(0.5)))


def test_extreme_weights_and_codes_stay_exact(rng):
    # every product at its largest (255 x -128), the deepest row the tests use
    a = np.tile(np.array([[-1.0, 1.0e-3]], np.float32), (3, 500))
    a[:, 1::2] = 1.0
    w = np.full((33, 1000), -128, np.int8)
    np.testing.assert_array_equal(run_motif(a, w, 1.0), matmul_i8_reference(a, w, np.float32(1.0)))


def test_a_row_gives_the_same_bits_alone_or_batched(rng):
    a = activations(rng, 23, 100)
    w = rng.integers(-128, 128, (70, 100), dtype=np.int8)
    batched = run_motif(a, w, 0.5)
    for lo, hi in [(0, 1), (3, 4), (0, 6), (1, 7), (5, 23), (22, 23)]:
        np.testing.assert_array_equal(run_motif(a[lo:hi], w, 0.5), batched[lo:hi])


def test_a_command_packs_the_weights_and_dispatches_the_motif(rng):
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    program = compile_command(checked, "project")
    w = rng.integers(-128, 128, (48, 36), dtype=np.int8)
    x = activations(rng, 9, 36)
    out = program.run({}, {}, {"x": x, "q": np.ascontiguousarray(w.T), "scale": np.array([0.25], np.float32)})
    np.testing.assert_array_equal(out["y"], matmul_i8_reference(x, w, np.float32(0.25)))


def test_launch_arguments_refuse_what_the_driver_cannot_read(rng):
    a = np.zeros((3, 8), np.float32)
    b = pack(np.zeros((20, 8), np.int8))
    c = np.zeros((3, 20), np.float32)
    scale = np.ones(1, np.float32)
    ws = np.zeros(i8gemm.workspace_elems(3, 8, 20), np.float32)
    with pytest.raises(ValueError, match="do not make"):
        i8gemm.launch_arguments("matmul_i8", [a, b, scale, np.zeros((3, 40), np.float32)], ws)
    with pytest.raises(ValueError, match="do not make"):
        i8gemm.launch_arguments("matmul_i8", [np.zeros((3, 12), np.float32), b, scale, c], ws)
    with pytest.raises(ValueError, match="contiguous"):
        i8gemm.launch_arguments("matmul_i8", [np.zeros((3, 16), np.float32)[:, ::2], b, scale, c], ws)
    with pytest.raises(ValueError, match="workspace"):
        i8gemm.launch_arguments("matmul_i8", [a, b, scale, c], ws[:-1])


def compute_all(data: dict) -> dict:
    """The motif on `data`: run here and in the subprocesses."""
    return {"c": run_motif(data["a"], data["w"], 0.03)}


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                    reason="the SIMD classes compared here are x86-64's")
def test_every_simd_class_computes_the_same_bits(rng, tmp_path):
    classes = [BASELINE] + ([AVX2] if host_has("avx2") else []) + ([AVX512] if host_has("avx512bw") else [])
    data = {"a": activations(rng, 14, 70), "w": rng.integers(-128, 128, (40, 70), dtype=np.int8)}
    here = compute_all(data)
    np.testing.assert_array_equal(here["c"], matmul_i8_reference(data["a"], data["w"], np.float32(0.03)))
    assert_same_bits_in_classes(classes, "test_i8gemm_motif:compute_all", data, here, tmp_path)


@pytest.mark.skipif(not host_has("avx512_vnni"), reason="vpdpbusd is emitted for AVX-512 VNNI hosts")
def test_the_tile_uses_the_vnni_instruction(tmp_path):
    import re

    function = i8gemm.load_function("matmul_i8", tmp_path)   # a fresh cache: numba keeps no asm for cached code
    function(*i8gemm.argument_examples("matmul_i8"))
    asm = function.inspect_asm(function.signatures[0])
    assert len(re.findall(r"\bvpdpbusd\b", asm)) >= 24, "the tile's 6 x 4 vpdpbusd are missing"

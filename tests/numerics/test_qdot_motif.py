"""The integer-dot motifs `matmul_q4_1_i16`, `matmul_q8_0_i16` (plain rows) and
`matmul_q4_1x16_i16`, `matmul_q8_0x16_i16` (the same blocks `repack`ed into 16-row panels):
the contracts of docs/language.md §11 bit for bit, their error against f32, batch invariance,
every SIMD class.

The contracts (loomc/lower/qdot.py): each 32-block of a row of x becomes 16-bit codes
q = rint(x * (1 / d)) with d = max |x| / 32767 (and s = d * sum(q)). Plain rows: per block
the exact integer dot with the weight's codes in 16 lanes (lane j: elements 2j and 2j + 1),
added as acc[j] = fma(f32(p[j]), dw * dx, acc[j]) in block order; q4_1 adds
mins = fma(mw, s, mins) in block order; then a fixed pairwise fold of the 16 lanes, + mins.
Panels: per block the exact integer dot P of all 32 codes, acc = fma(f32(P), dw * dx, acc),
then for q4_1 acc = fma(mw, s, acc), in block order. The references below compute that with
exact rationals, each rounding once where the contract rounds, from the GGUF blocks that
gguf's own quantizer wrote.
"""

from __future__ import annotations

import os
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from loomc.check import load_files
from loomc.lower import qdot
from loomc.run.compile import compile_command
from loomrt.prepare import panel_order
from numerics_testlib import (AVX2, AVX512, BASELINE, QTYPES, ZEN5, assert_same_bits_in_classes, f32_nearest, host_has,
                             quantize, quantized)

FIXTURE = Path(__file__).parent / "fixtures" / "qdot.loom"
MOTIF = {"q4_1": "matmul_q4_1_i16", "q8_0": "matmul_q8_0_i16", "q4_1x16": "matmul_q4_1x16_i16",
         "q8_0x16": "matmul_q8_0x16_i16"}
PLAIN = {"q4_1": "q4_1", "q8_0": "q8_0", "q4_1x16": "q4_1", "q8_0x16": "q8_0"}   # the blocks a dtype holds

# The SIMD classes compiled in a subprocess: no AVX (plain vector IR), AVX2 (vpmaddwd on ymm),
# AVX-512 of 2017 (vpmaddwd on zmm, no VNNI or FP16; one row of x on ymm halves), and the same
# features tuned for Zen 5 (one row of x on zmm too).


def run_motif(dtype: str, x: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """The motif of `dtype` on `blocks` (plain blocks; for panels, repacked here)."""
    if dtype != PLAIN[dtype]:
        blocks = panel_order(blocks, dtype)
    y = np.zeros((x.shape[0], blocks.shape[0]), np.float32)
    workspace = np.zeros(qdot.workspace_elems(*x.shape), np.float32)
    qdot.load_function(MOTIF[dtype])(*qdot.launch_arguments(MOTIF[dtype], [x, blocks, y], workspace))
    return y


def weight_codes(dtype: str, blocks: np.ndarray):
    """(dw, mw or None, codes [N, B, 32]) read from the GGUF bytes."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, qdot.BLOCK_BYTES[dtype])
    dw = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if dtype == "q4_1":
        raw = b[..., 4:].astype(np.int64)
        return dw, b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32), np.concatenate([raw & 15, raw >> 4], -1)
    return dw, None, b[..., 2:].view(np.int8).astype(np.int64)


def activation_codes(x: np.ndarray):
    """(d, s, codes [T, B, 32]) as the contract quantizes x: IEEE f32 division and product."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = np.abs(xb).max(-1) / np.float32(32767)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    codes = np.rint(xb * inv[..., None]).astype(np.int64)
    return d, d * codes.sum(-1).astype(np.float32), codes


def fma(a, b, c) -> np.float32:
    return f32_nearest(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def contract(dtype: str, x: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    if dtype != PLAIN[dtype]:
        return panel_contract(PLAIN[dtype], x, blocks)
    dw, mw, wq = weight_codes(dtype, blocks)
    dx, sx, xq = activation_codes(x)
    y = np.zeros((x.shape[0], blocks.shape[0]), np.float32)
    for t in range(x.shape[0]):
        for n in range(blocks.shape[0]):
            acc = [np.float32(0)] * 16
            mins = np.float32(0)
            for b in range(wq.shape[1]):
                lanes = (wq[n, b] * xq[t, b]).reshape(16, 2).sum(-1)
                scale = dw[n, b] * dx[t, b]
                acc = [fma(float(lanes[j]), scale, acc[j]) for j in range(16)]
                if mw is not None:
                    mins = fma(mw[n, b], sx[t, b], mins)
            v = np.array(acc, np.float32)
            v = v[:8] + v[8:]
            v = v[:4] + v[4:]
            v = v[:2] + v[2:]
            y[t, n] = v[0] + v[1] + mins if mw is not None else v[0] + v[1]
    return y


def panel_contract(plain: str, x: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """The panels' contract on plain blocks: a lane per row of w, no fold."""
    dw, mw, wq = weight_codes(plain, blocks)
    dx, sx, xq = activation_codes(x)
    y = np.zeros((x.shape[0], blocks.shape[0]), np.float32)
    for t in range(x.shape[0]):
        dots = np.einsum("nbk,bk->nb", wq, xq[t])   # exact: int64
        for n in range(blocks.shape[0]):
            acc = np.float32(0)
            for b in range(wq.shape[1]):
                acc = fma(f32_nearest(Fraction(int(dots[n, b]))), dw[n, b] * dx[t, b], acc)
                if mw is not None:
                    acc = fma(mw[n, b], sx[t, b], acc)
            y[t, n] = acc
    return y


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0", "q4_1x16", "q8_0x16"])
@pytest.mark.parametrize("t, k, n", [(1, 32, 1), (3, 96, 9), (5, 64, 13), (4, 576, 4), (9, 160, 6), (2, 1536, 3),
                                     (8, 64, 20), (15, 96, 17), (20, 1024, 3)])
def test_bits_equal_the_contract(rng, dtype, t, k, n):
    # (20, 1024): 640 blocks of x, past qdot.PARALLEL_QUANTIZE_BLOCKS, so x is quantized in a
    # parallel region of its own; the other cases quantize on one thread
    # panels: whole panels of 16 rows; T = 15 runs tiles of 8, 4, 2 and 1 rows of x
    n = n if dtype == PLAIN[dtype] else -(-n // 16) * 16
    blocks, _ = quantized(rng, PLAIN[dtype], n, k)
    x = (rng.standard_normal((t, k)) * 3).astype(np.float32)
    x[0, :32] = 0   # an all-zero block: scale 0, codes 0
    if k >= 64:
        x[-1, 40] = 900.0   # an outlier: its block's other codes get coarse
    np.testing.assert_array_equal(run_motif(dtype, x, blocks), contract(dtype, x, blocks))


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0", "q4_1x16", "q8_0x16"])
def test_a_nan_in_x_quantizes_to_code_zero_beside_its_block_s_other_codes(rng, dtype):
    # the largest |x| of a block ignores NaN (maxnum), and a NaN's code is 0 (saturating
    # conversion): the result is exactly that of x with the NaN replaced by 0. A block of NaN
    # only has no largest value: its scale is NaN, and so is every output of its row
    n = 4 if dtype == PLAIN[dtype] else 16
    blocks, _ = quantized(rng, PLAIN[dtype], n, 128)
    x = (rng.standard_normal((3, 128)) * 3).astype(np.float32)
    x[0, 5] = x[1, 70] = x[1, 71] = np.nan
    x[2, 33] = 1e-42   # a subnormal beside normal values: code 0
    got = run_motif(dtype, x, blocks)
    np.testing.assert_array_equal(got, run_motif(dtype, np.nan_to_num(x, nan=0.0), blocks))
    np.testing.assert_array_equal(got, contract(dtype, np.nan_to_num(x, nan=0.0), blocks))
    x[2, 64:96] = np.nan
    got = run_motif(dtype, x, blocks)
    assert np.isnan(got[2]).all() and np.isfinite(got[:2]).all()


def test_an_all_nan_block_s_scale_carries_its_last_lane_s_nan(rng):
    # no largest value: the scale is |x[31]| / 32767, a NaN with that lane's payload (what the
    # quantizing pass has always given; its integer maximum keeps it), and the row's outputs NaN
    blocks, _ = quantized(rng, "q8_0", 16, 64)
    payloads = np.uint32(0x7FC00000) + rng.permutation(32).astype(np.uint32) * np.uint32(1000) + np.uint32(7)
    x = (rng.standard_normal((1, 64)) * 3).astype(np.float32)
    x[0, :32] = payloads.view(np.float32)
    x[0, 3] = -x[0, 3]
    y = np.zeros((1, 16), np.float32)
    workspace = np.zeros(qdot.workspace_elems(1, 64), np.float32)
    qdot.load_function(MOTIF["q8_0x16"])(*qdot.launch_arguments(MOTIF["q8_0x16"], [x, panel_order(blocks, "q8_0x16"), y],
                                                                workspace))
    scale = workspace[64 // 2]   # after the row's 64 codes: block 0's scale
    assert scale.view(np.uint32) == (np.abs(x[0, 31]) / np.float32(32767)).view(np.uint32)
    assert np.isnan(y).all()


def quantizing_pass(x: np.ndarray):
    """The workspace's (codes, scales, sums) after a motif call on x: [T, B, 32], [T, B], [T, B]."""
    t, k = x.shape
    b = k // 32
    workspace = np.zeros(qdot.workspace_elems(t, k), np.float32)
    blocks, _ = quantized(np.random.default_rng(0), "q8_0", 16, k)
    qdot.load_function(MOTIF["q8_0x16"])(*qdot.launch_arguments(
        MOTIF["q8_0x16"], [x, panel_order(blocks, "q8_0x16"), np.zeros((t, 16), np.float32)], workspace))
    codes = workspace[:t * k // 2].view(np.int16).reshape(t, b, 32)
    scales = workspace[t * k // 2:t * k // 2 + t * b].reshape(b, t).T
    sums = workspace[t * k // 2 + t * b:t * k // 2 + 2 * t * b].reshape(b, t).T
    return codes, scales, sums


def test_blocks_quantized_16_at_a_time_get_the_bits_each_gets_alone(rng):
    # the quantizing pass takes 16 blocks of a row at once (their maxima, divisions and code
    # sums as vectors across the blocks; loomc/lower/qdot.py) and the rest one by one: 35 blocks
    # are 2 groups and 3 blocks alone. Each block must get the bits it gets quantized alone, its
    # specials included; a group holding an all-NaN block takes the one-by-one path
    x = (rng.standard_normal((3, 35 * 32)) * 3).astype(np.float32)
    x[0, 2 * 32:3 * 32] = 0.0                                   # scale 0, codes 0
    x[0, 3 * 32 + 5] = np.nan                                   # a NaN lane: code 0, not the maximum
    x[0, 4 * 32 + 7] = np.inf                                   # an infinite maximum: scale inf
    x[0, 5 * 32:6 * 32] = rng.standard_normal(32).astype(np.float32) * np.float32(1e-41)   # subnormal maximum
    x[0, 6 * 32:7 * 32] = -0.0
    x[0, 7 * 32 + 1] = np.float32(3.0e38)                       # near f32's largest
    x[1, 20 * 32 + 9] = -np.inf
    x[2, 17 * 32:18 * 32] = np.nan                              # all NaN: its group goes block by block
    x[2, 18 * 32 + 3] = np.nan
    codes, scales, sums = quantizing_pass(x)
    for block in range(35):
        alone = quantizing_pass(np.ascontiguousarray(x[:, block * 32:(block + 1) * 32]))
        for got, want in zip((codes, scales, sums), alone):
            np.testing.assert_array_equal(got[:, block].view(np.uint32 if got.dtype == np.float32 else np.uint16),
                                          want[:, 0].view(np.uint32 if want.dtype == np.float32 else np.uint16))
    # and the blocks without NaN or infinity are the contract's (numpy's IEEE division and product)
    clean = [b for b in range(35) if np.isfinite(x[:, b * 32:(b + 1) * 32]).all()]
    d, s, q = activation_codes(x[:, [i for b in clean for i in range(b * 32, (b + 1) * 32)]])
    np.testing.assert_array_equal(codes[:, clean], q)
    np.testing.assert_array_equal(scales[:, clean].view(np.uint32), d.view(np.uint32))
    np.testing.assert_array_equal(sums[:, clean].view(np.uint32), s.astype(np.float32).view(np.uint32))
    assert np.isnan(scales[2, 17]) and np.isinf(scales[0, 4]) and scales[0, 2] == 0


def test_q8_0_panels_round_a_dot_past_2_to_the_24_once(rng):
    # all-positive weights and activations near their blocks' largest: |P| ~ 32 * 127 * 32767,
    # past f32's exact integers, so f32(P) rounds; the contract rounds it once, to nearest
    w = (1 + 0.01 * rng.standard_normal((16, 64))).astype(np.float32)
    blocks = quantize(w, QTYPES["q8_0"])
    x = (1 + 0.01 * rng.standard_normal((2, 64))).astype(np.float32)
    _, _, wq = weight_codes("q8_0", blocks)
    _, _, xq = activation_codes(x)
    dots = np.einsum("nbk,tbk->tnb", wq, xq)
    assert (np.abs(dots) > 2 ** 24).all() and any(int(f32_nearest(Fraction(int(p)))) != p for p in dots.ravel())
    np.testing.assert_array_equal(run_motif("q8_0x16", x, blocks), contract("q8_0x16", x, blocks))


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0", "q4_1x16", "q8_0x16"])
def test_error_is_at_most_half_a_code_step(rng, dtype):
    # against y = x . dequantize(w)^T in float64: rounding x to codes moves each element by at
    # most d / 2, so |error| <= sum over blocks of d / 2 * sum |w| there, plus the f32 roundings
    # of the accumulation (far smaller: 1e-6 of sum |x w|)
    t, k, n = 7, 576, 304
    blocks, w = quantized(rng, PLAIN[dtype], n, k)
    x = (rng.standard_normal((t, k)) * np.exp(rng.standard_normal((t, k)))).astype(np.float32)
    got = run_motif(dtype, x, blocks).astype(np.float64)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    d, _, _ = activation_codes(x)
    step = (d.astype(np.float64)[:, None, :] / 2 * np.abs(w.astype(np.float64)).reshape(n, -1, 32).sum(-1)[None]).sum(-1)
    bound = step + 1e-6 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)
    assert (np.abs(got - exact) <= bound).all()
    # and the error is real quantization, not a lucky zero: the rounding errors of 576 codes
    # are independent, so they add like a random walk, a few percent of the worst-case sum
    assert 0.005 < float(np.mean(np.abs(got - exact) / bound)) < 0.2


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0", "q4_1x16", "q8_0x16"])
def test_a_row_gives_the_same_bits_alone_or_batched(rng, dtype):
    rows = 23 if dtype == PLAIN[dtype] else 48   # plain: 5 tasks of 4 rows of w and a partial one; panels: 3
    blocks, _ = quantized(rng, PLAIN[dtype], rows, 192)
    x = (rng.standard_normal((11, 192)) * 2).astype(np.float32)
    batched = run_motif(dtype, x, blocks)
    for lo, hi in [(0, 1), (3, 4), (0, 4), (1, 6), (2, 11), (10, 11)]:
        np.testing.assert_array_equal(run_motif(dtype, x[lo:hi], blocks), batched[lo:hi])


def test_commands_dispatch_both_motifs(rng):
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    program = compile_command(checked, "project")
    w4, _ = quantized(rng, "q4_1", 32, 64)
    w8, _ = quantized(rng, "q8_0", 10, 32)
    x = (rng.standard_normal((5, 64))).astype(np.float32)
    out = program.run({}, {}, {"x": x, "w4": w4, "w8": w8})
    hidden = run_motif("q4_1", x, w4)
    np.testing.assert_array_equal(out["y"], run_motif("q8_0", hidden, w8))


def test_launch_arguments_refuse_what_the_driver_cannot_read(rng):
    blocks, _ = quantized(rng, "q4_1", 8, 64)
    x = np.zeros((3, 64), np.float32)
    ws = np.zeros(qdot.workspace_elems(3, 64), np.float32)
    with pytest.raises(ValueError, match="contiguous"):
        qdot.launch_arguments("matmul_q4_1_i16", [np.zeros((3, 128), np.float32)[:, ::2], blocks,
                                                  np.zeros((3, 8), np.float32)], ws)
    with pytest.raises(ValueError, match="workspace"):
        qdot.launch_arguments("matmul_q4_1_i16", [x, blocks, np.zeros((3, 8), np.float32)], ws[:-1])
    with pytest.raises(ValueError, match="do not make"):
        qdot.launch_arguments("matmul_q8_0_i16", [x, blocks, np.zeros((3, 8), np.float32)], ws)
    with pytest.raises(ValueError, match="whole panels"):
        qdot.launch_arguments("matmul_q4_1x16_i16", [x, blocks[:6], np.zeros((3, 6), np.float32)], ws)
    k, table = key_cache(rng)
    panels = panel_order(quantized(rng, "q4_1", 16, 64)[0], "q4_1x16")
    y = np.zeros((3, 16), np.float32)
    tokens = np.zeros(3, np.int32)
    with pytest.raises(ValueError, match="the cache read ahead must be contiguous"):
        qdot.launch_arguments("matmul_q4_1x16_i16_ahead", [x, panels, y, k[:, ::2], tokens, tokens, table, 0], ws)
    with pytest.raises(ValueError, match="one entry per token"):
        qdot.launch_arguments("matmul_q4_1x16_i16_ahead", [x, panels, y, k, tokens, tokens[:2], table, 0], ws)


def key_cache(rng):
    """A cache of 3 layers and pages of 16 positions by 64 features, page tables of two rows
    (a missing page and an id past the cache included), and tokens with rows and positions
    inside and outside them: the operands `matmul_q4_1x16_i16_ahead` reads ahead from."""
    k = rng.standard_normal((10, 3, 16, 64)).astype(np.float32)
    table = np.array([[3, 1, -1, 99], [0, 2, 5, 4]], np.int32)
    return k, table


def run_ahead(x: np.ndarray, panels: np.ndarray, k, rows, positions, table, layer) -> np.ndarray:
    y = np.zeros((x.shape[0], panels.shape[0]), np.float32)
    workspace = np.zeros(qdot.workspace_elems(*x.shape), np.float32)
    motif = "matmul_q4_1x16_i16_ahead"
    qdot.load_function(motif)(*qdot.launch_arguments(motif, [x, panels, y, k, rows, positions, table, layer], workspace))
    return y


@pytest.mark.parametrize("t", [1, 3, 4, 8, 13])
@pytest.mark.parametrize("layer", [1, 3, -1])
def test_the_read_ahead_motif_gives_the_panel_motif_s_bits(rng, t, layer):
    # below AHEAD_TOKENS rows it reads nothing ahead, from it the first tile of every panel
    # does; a layer outside the cache asks for nothing
    blocks, _ = quantized(rng, "q4_1", 48, 192)
    x = (rng.standard_normal((t, 192)) * 2).astype(np.float32)
    k, table = key_cache(rng)
    rows = rng.integers(-1, 3, t).astype(np.int32)
    positions = rng.integers(-2, 64, t).astype(np.int32)
    got = run_ahead(x, panel_order(blocks, "q4_1x16"), k, rows, positions, table, layer)
    np.testing.assert_array_equal(got, run_motif("q4_1x16", x, blocks))


def test_the_keys_read_ahead_are_the_pages_attention_paged_reads(rng):
    # a row's pages up to its tokens' last position (attention_paged's keys 0..p), only those
    # with a valid id, of the one layer: byte offsets into the cache of whole (page, layer) spans
    from loomc.lower.numba import load_module, module_path

    spans = load_module(module_path(qdot.render_module("matmul_q4_1x16_i16_ahead"), None))._lm_key_spans
    k, table = key_cache(rng)
    rows = np.array([1, 1, 0, 2, -1], np.int32)   # row 2 is past the table, -1 no row
    positions = np.array([20, 33, 17, 5, 9], np.int32)
    starts, lines = spans(k, rows, positions, table, 2)
    span = 16 * 64 * 4
    assert lines == span // 64
    # row 1 reaches position 33: its pages 0, 1 and 2 (ids 0, 2, 5); row 0 position 17: pages 0 and 1 (3, 1)
    assert sorted(starts.tolist()) == sorted(((page * 3 + 2) * span) for page in (0, 2, 5, 3, 1))
    assert spans(k, rows, positions, table, 3)[0].size == 0
    assert spans(k, rows, np.full(5, -1, np.int32), table, 0)[0].size == 0


def compute_all(data: dict) -> dict:
    """The motifs on `data` (x and each dtype's blocks): run here and in the subprocesses."""
    out = {d: run_motif(d, data["x"], data[d]) for d in MOTIF}
    k, table = key_cache(np.random.default_rng(7))
    rows, positions = np.arange(len(data["x"]), dtype=np.int32) % 2, np.arange(len(data["x"]), dtype=np.int32) * 4
    out["q4_1x16 read ahead"] = run_ahead(data["x"], panel_order(data["q4_1x16"], "q4_1x16"), k, rows, positions,
                                          table, 1)
    return out


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                    reason="the SIMD classes compared here are x86-64's")
def test_every_simd_class_computes_the_same_bits(rng, tmp_path):
    classes = [BASELINE] + ([AVX2] if host_has("avx2") else []) + ([AVX512, ZEN5] if host_has("avx512bw") else [])
    # plain rows: 4 rows of x in tiles, 3 alone (T = 1's path); panels: tiles of 8, 4, 2 and 1 (without
    # AVX-512: 4, 4, 4, 2 and 1, the panel's rows in halves of 8); 17 blocks a row: the quantizing pass's
    # group of 16 and one block alone
    data = {"x": (rng.standard_normal((15, 544)) * 2).astype(np.float32)}
    for dtype in MOTIF:
        data[dtype], _ = quantized(rng, PLAIN[dtype], 9 if dtype == PLAIN[dtype] else 32, 544)   # repacked by run_motif
    assert_same_bits_in_classes(classes, "test_qdot_motif:compute_all", data, compute_all(data), tmp_path)


@pytest.mark.skipif(not host_has("avx2"), reason="vpmaddwd is emitted for AVX2 and AVX-512 hosts")
@pytest.mark.parametrize("motif", ["matmul_q4_1_i16", "matmul_q4_1x16_i16", "matmul_q8_0x16_i16"])
def test_the_hot_loop_uses_the_integer_dot_instruction(tmp_path, motif):
    import re

    function = qdot.load_function(motif, tmp_path)   # a fresh cache: numba keeps no asm for cached code
    function(*qdot.argument_examples(motif))
    asm = function.inspect_asm(function.signatures[0])
    # panels on AVX-512 VNNI hosts: vpdpwssd (the multiply and the add in one)
    want = "vpdpwssd" if motif != "matmul_q4_1_i16" and host_has("avx512_vnni") else "vpmaddwd"
    assert re.search(rf"\b{want}\b", asm), f"no {want} in the compiled motif"


_TILE_ASM_CHILD = """
import json, pathlib, re, sys
import numpy as np
from loomc.lower import qdot
motif = sys.argv[1]
function = qdot.load_function(motif, pathlib.Path(sys.argv[2]))   # a fresh cache: numba keeps no asm for cached code
x = np.zeros((8, 64), np.float32)
w = np.zeros((16, 2 * qdot.BLOCK_BYTES[qdot.MOTIFS[motif]]), np.uint8)
function(x, w, np.zeros((8, 16), np.float32), np.zeros(qdot.workspace_elems(8, 64), np.float32))
loops = []
for block in re.split(r"\\n(?=\\.LBB\\S+:)", function.inspect_asm(function.signatures[0])):
    code = [line.strip() for line in block.splitlines()[1:] if line.strip() and not line.strip().startswith((".", "#"))]
    dots = sum("vpmaddwd" in line for line in code)
    if dots >= 64:   # a tile's block: 4 rows of x against both halves of the panel
        loops.append({"dots": dots, "stack": sum("rsp" in line for line in code), "instructions": len(code)})
print(json.dumps(loops))
"""


@pytest.mark.skipif(not host_has("avx2") or os.uname().machine != "x86_64", reason="runs AVX2 code")
@pytest.mark.parametrize("motif", ["matmul_q4_1x16_i16", "matmul_q8_0x16_i16"])
def test_the_avx2_panel_tile_keeps_its_sums_in_registers(tmp_path, motif):
    """AVX2's 16 ymm: a tile of 4 rows of x holds 8 integer sums of 8 lanes (the panel's two
    halves of 8 rows) and adds each product as it comes, its float accumulators in y. With a
    16-lane integer and float accumulator per row of x it spilled: 206 stack references for
    128 `vpmaddwd`."""
    import json
    import subprocess

    cpu, features = AVX2
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features}
    run = subprocess.run([sys.executable, "-c", _TILE_ASM_CHILD, motif, str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-2000:]
    loops = json.loads(run.stdout.strip().splitlines()[-1])
    assert loops, "no tile loop of 64 or more vpmaddwd in the AVX2 build"
    for loop in loops:
        assert loop["stack"] * 2 < loop["dots"], loop

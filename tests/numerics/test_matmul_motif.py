"""The `matmul` motif: every element is the exact fma chain, whatever the batch, threads or SIMD class.

docs/language.md §11 fixes what `matmul(a, b, c)` computes: c[m, n] is one chain of fused
multiply-adds over k in increasing order from +0.0. The reference here is that chain computed
with exact rationals (`numerics_testlib.fma_chain`), so equality is the contract itself, not
a tolerance tuned on one machine; the same bits must come out when the row shares its call
with other rows, when numba runs on one thread, and when the kernel is compiled for another
SIMD class (baseline x86-64 without FMA; AVX2 when this host has AVX-512) in a subprocess.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from numerics_testlib import AVX2, BASELINE, assert_same_bits_in_classes, fma_chain, host_has

from loomc.check import load_files
from loomc.run.compile import compile_command

FIXTURE = Path(__file__).parent / "fixtures" / "matmul.loom"



@pytest.fixture(scope="module")
def product():
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    program = compile_command(checked, "product")
    return lambda a, b: program.run({}, {}, {"a": a, "b": b})["c"]


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 7, 5), (17, 33, 6), (16, 64, 13), (33, 5, 7), (2, 130, 12),
                                     (18, 400, 14), (37, 20, 20), (20, 30, 37), (20, 130, 37), (21, 50, 600)])
# (18, 400, 14): k in two packed slices; more rows of a than of b (17 x 6, 33 x 7, 37 x 20: a
# partial last block of a and two panels of b) swaps the roles, and so does a short k (20, 30, 37;
# 21 x 600: more rows of b than one pass of accumulators holds, so two passes); (20, 130, 37)
# does not
def test_each_element_is_the_exact_fma_chain(product, rng, m, k, n):
    a, b = rand(rng, m, k), rand(rng, n, k)
    np.testing.assert_array_equal(product(a, b), fma_chain(a, b))


@pytest.fixture(scope="module")
def programs():
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    return {name: compile_command(checked, name) for name in ("product_f16", "batched")}


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (5, 33, 7), (17, 64, 13), (20, 64, 150), (20, 130, 150)])
def test_f16_weights_give_the_chain_of_their_exact_f32_values(programs, rng, m, k, n):
    a, b = rand(rng, m, k), rand(rng, n, k).astype(np.float16)
    got = programs["product_f16"].run({}, {}, {"a": a, "b": b})["c"]
    np.testing.assert_array_equal(got, fma_chain(a, b.astype(np.float32)))


def test_many_columns_split_into_chunks_of_b_keep_each_chain(product, rng):
    # 1000 x 400 f32 of b is more than one L2 chunk, k is more than one packed slice, and
    # 1000 is not a multiple of the tile: each column still equals its call alone and the chain
    a, b = rand(rng, 18, 400), rand(rng, 1000, 400)
    whole = product(a, b)
    for n in (0, 437, 874, 999):
        alone = product(a, b[n:n + 1].copy())[:, 0]
        np.testing.assert_array_equal(whole[:, n], alone)
    np.testing.assert_array_equal(whole[:, 999:], fma_chain(a, b[999:]))


def test_swapped_blocks_of_a_grouped_per_task_keep_each_chain(product, rng):
    # 1030 rows of a against 384 of b at k 700: the packed b (24 panels x 700) outgrows a chunk,
    # so each task runs 4 blocks of a's rows over every slice of a panel (the last block partial)
    from loomc.lower import matmul

    m, k, n = 1030, 700, 384
    assert matmul.swapped(m, k, n) and -(-n // matmul.PANEL_ROWS) * k * matmul.PANEL_ROWS > matmul.CHUNK_ELEMS
    a, b = rand(rng, m, k), rand(rng, n, k)
    rows = [0, 15, 16, 47, 63, 64, 500, 1023, 1024, 1029]
    np.testing.assert_array_equal(product(a, b)[rows], fma_chain(a[rows], b))


@pytest.mark.parametrize("motif", ["matmul", "matmul_f16", "bmm"])
@pytest.mark.parametrize("g, m, k, n", [(1, 200, 400, 603), (1, 96, 500, 1000), (1, 300, 64, 200),
                                        (1, 1030, 700, 384), (2, 257, 64, 257), (1, 21, 50, 600), (1, 40, 300, 1100),
                                        (1, 203, 300, 256)])
# wide tile, roles kept: a partial last panel, a partial last block of b, k in three slices
# (200 x 603), b in several chunks (96 x 1000); roles swapped (more rows of a, or a short k):
# a partial block of a (300, 1030: grouped per task), two groups (257 x 257), two passes (600);
# 40 rows of a: the narrow tile (40 fills 48 of its lanes, 64 of the wide one's); 203 x 256:
# swapped with fewer rows of a than of b (`swapped`'s near rule), a partial block of a
def test_both_tiles_compute_each_chain(rng, motif, g, m, k, n):
    from loomc.lower import matmul
    from loomc.lower.numba import load_module, module_path

    if motif != "bmm":
        g = 1
    gemm = matmul.load_function(motif)   # writes the module to the kernel cache if it is not there
    module = load_module(module_path(matmul.render_module(motif)))
    drivers = [getattr(module, f"k_{motif}_n")] + ([getattr(module, f"k_{motif}_w")] if matmul.WIDE_TILE else [])
    a, b = rand(rng, g, m, k), rand(rng, g, n, k)
    if motif == "matmul_f16":
        b = b.astype(np.float16)
    weights = b.view(np.uint16) if motif == "matmul_f16" else b
    entry = np.full((g, m, n), np.nan, np.float32)   # the entry with exactly the workspace it asks for
    gemm(a, weights, entry, np.zeros(matmul.workspace_elems(motif, g, m, k, n), np.float32))
    assert not np.isnan(entry).any()   # every element stored (whole tiles as vectors, edges one by one)
    for driver in drivers:
        c = np.full((g, m, n), np.nan, np.float32)
        driver(a, weights, c, np.zeros(1 << 23, np.float32))
        np.testing.assert_array_equal(c, entry)
    rows, cols = [0, m // 2, m - 1], [0, n // 3, n - 1]
    np.testing.assert_array_equal(entry[-1][np.ix_(rows, cols)], fma_chain(a[-1][rows], b[-1][cols].astype(np.float32)))


@pytest.mark.parametrize("motif", ["matmul", "matmul_f16", "bmm"])
@pytest.mark.parametrize("m, n", [(7, 5), (700, 5), (700, 800), (40, 1100)])
def test_an_empty_k_gives_zeros_on_every_path(motif, m, n):
    # The first slice of k starts each chain from +0.0 instead of zeroed accumulators; with no
    # slice at all (k = 0) the accumulators are zeroed, so c is the empty chain's +0.0
    from loomc.lower import matmul
    from loomc.lower.numba import load_module, module_path

    gemm = matmul.load_function(motif)
    module = load_module(module_path(matmul.render_module(motif)))
    drivers = [gemm, getattr(module, f"k_{motif}_n")] + ([getattr(module, f"k_{motif}_w")] if matmul.WIDE_TILE else [])
    g = 2 if motif == "bmm" else 1
    a = np.zeros((g, m, 0), np.float32)
    b = np.zeros((g, n, 0), np.uint16 if motif == "matmul_f16" else np.float32)
    for driver in drivers:
        c = np.full((g, m, n), np.nan, np.float32)
        driver(a, b, c, np.zeros(max(1, matmul.workspace_elems(motif, g, m, 0, n)), np.float32))
        np.testing.assert_array_equal(c, np.zeros((g, m, n), np.float32))
        assert not np.signbit(c).any()


def test_the_roles_swap_where_b_is_small_and_a_has_not_many_fewer_rows():
    from loomc.lower import matmul

    assert matmul.swapped(2056, 384, 384) and matmul.swapped(300, 384, 200)     # more rows of a
    assert matmul.swapped(200, 768, 256) and matmul.swapped(96, 384, 128)       # at least 7/10 of b's
    assert not matmul.swapped(64, 384, 64)                                      # too few rows of a
    assert not matmul.swapped(100, 384, 512) and not matmul.swapped(200, 256, 768)   # too many of b
    assert matmul.swapped(40, 64, 1100)                                         # a short k, whatever b


def test_the_wide_tile_runs_where_its_panels_are_full(monkeypatch):
    from loomc.lower import matmul

    monkeypatch.setattr(matmul, "WIDE_TILE", (32, 8))
    wide, narrow = (32, 8, matmul.WIDE_K_SLICE), (matmul.PANEL_ROWS, matmul.TILE_COLS, matmul.K_SLICE)
    assert matmul.tile_for(2056, 384, 1152) == wide      # a's rows are the panels
    assert matmul.tile_for(96, 384, 1152) == wide
    assert matmul.tile_for(48, 384, 1152) == narrow      # 64 lanes for 48 rows (the narrow tile: 48)
    assert matmul.tile_for(16, 384, 1152) == narrow
    assert matmul.tile_for(2056, 384, 257) == wide       # swapped: b's rows are the panels (288 vs 272 lanes)
    assert matmul.tile_for(2056, 384, 80) == narrow      # 96 vs 80 lanes
    monkeypatch.setattr(matmul, "WIDE_TILE", None)
    assert matmul.tile_for(2056, 384, 1152) == narrow


def test_f16_weights_widened_per_task_or_once_per_call_give_the_same_bits(rng, monkeypatch):
    # With room in the workspace the f16 weights are widened once per call; without (a weight
    # over WIDE_LIMIT), every task widens its blocks: the two paths compute the same chains.
    from loomc.lower import matmul

    gemm = matmul.load_function("matmul_f16")
    # (fewer rows of a than of b: the roles do not swap)
    a, b = rand(rng, 1, 20, 470), rand(rng, 1, 150, 470).astype(np.float16).view(np.uint16)
    wide, local = np.zeros((1, 20, 150), np.float32), np.zeros((1, 20, 150), np.float32)
    gemm(a, b, wide, np.zeros(matmul.workspace_elems("matmul_f16", 1, 20, 470, 150), np.float32))
    monkeypatch.setattr(matmul, "WIDE_LIMIT", 0)
    gemm(a, b, local, np.zeros(matmul.workspace_elems("matmul_f16", 1, 20, 470, 150), np.float32))
    np.testing.assert_array_equal(wide, local)
    np.testing.assert_array_equal(wide[0, ::13], fma_chain(a[0, ::13], b[0].view(np.float16).astype(np.float32)))
    with pytest.raises(ValueError, match="workspace"):
        gemm(a, b, local, np.zeros(0, np.float32))


def test_batched_products_are_each_the_chain_and_independent(programs, rng):
    a, b = rand(rng, 3, 9, 21), rand(rng, 3, 8, 21)
    got = programs["batched"].run({}, {}, {"a": a, "b": b})["c"]
    for g in range(3):
        np.testing.assert_array_equal(got[g], fma_chain(a[g], b[g]))
    alone = programs["batched"].run({}, {}, {"a": a[1:2].copy(), "b": b[1:2].copy()})["c"]
    np.testing.assert_array_equal(alone[0], got[1])


def test_cancellation_and_tiny_values_follow_the_chain(product, rng):
    """Terms that cancel, and products in the subnormal range, where another order would differ."""
    a = np.array([[1e30, 1.0, -1e30, 3.0, 1e-30], [1e-20, 1e-20, 1e-20, 1e-20, 1e-20]], np.float32)
    b = np.array([[1.0, 1e-7, 1.0, 1e-8, 1e-15], [1e-20, -1e-20, 1e-20, -1e-20, 1e-20]], np.float32)
    np.testing.assert_array_equal(product(a, b), fma_chain(a, b))


def test_close_to_float64_at_model_shapes(product, rng):
    a, b = rand(rng, 70, 384), rand(rng, 1152, 384, scale=0.05)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    bound = 384 * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T)
    assert (np.abs(product(a, b) - want) <= bound).all()


def test_a_row_does_not_depend_on_the_other_rows(product, rng):
    """One row alone, among 7 others, and at a late position of a pack of 40 whose other rows
    hold huge values, infinities and NaN: the same bits every time."""
    k, b = 384, rand(rng, 45, 384, scale=0.05)
    x = rand(rng, 1, k)
    alone = product(x, b)[0]
    batch = rand(rng, 8, k)
    batch[5] = x[0]
    np.testing.assert_array_equal(product(batch, b)[5], alone)
    pack = rand(rng, 40, k, scale=1e30)
    pack[3, 7], pack[11, 0], pack[30] = np.inf, np.nan, -np.inf
    pack[37] = x[0]
    np.testing.assert_array_equal(product(pack, b)[37], alone)
    # 40 rows against 20 of b swap the roles (a read in place, b packed): the same bits as alone
    few = b[:20].copy()
    np.testing.assert_array_equal(product(pack, few)[37], product(x, few)[0])


def test_a_column_does_not_depend_on_the_other_rows_of_b(product, rng):
    a, w = rand(rng, 21, 96), rand(rng, 13, 96)
    whole = product(a, w)
    for n in (0, 5, 6, 12):  # first, inside and past the first six-row block, the last
        np.testing.assert_array_equal(product(a, w[n:n + 1].copy())[:, 0], whole[:, n])


def test_thread_count_does_not_change_the_bits(product, rng):
    a, b = rand(rng, 50, 200), rand(rng, 70, 200)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = product(a, b)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(product(a, b), one)


def compute_everything(data: dict) -> dict:
    """The matmul and attention motifs and three kernels that lean on the target (fma, sqrt and division, f16
    scales read with or without F16C), on `data`; run here and in the subprocess."""
    from numerics_testlib import MOTIFS

    from loomc.run.compile import compile_kernel

    product = compile_command(load_files([FIXTURE]), "product")
    out = {"product": product.run({}, {}, {"a": data["a"], "b": data["b"]})["c"],
           # the wide tile on AVX-512 hosts (the narrow one in an AVX2 or baseline subprocess), both roles
           "wide_swapped": product.run({}, {}, {"a": data["a_wide"], "b": data["b_wide"][:96]})["c"],
           "wide": product.run({}, {}, {"a": data["a_wide"][:96], "b": data["b_wide"]})["c"]}
    motifs = load_files(sorted(MOTIFS.glob("*.loom")))
    x = data["x"]
    out["rmsnorm"] = np.zeros_like(x)
    compile_kernel(motifs, "rmsnorm")(x, data["w"], 1e-5, out["rmsnorm"])
    out["layernorm"] = np.zeros_like(x)
    compile_kernel(motifs, "layernorm")(x, data["w"], data["bias"], 1e-5, out["layernorm"])
    out["matmul_q4_1"] = np.zeros((x.shape[0], data["q4_1"].shape[0]), np.float32)
    compile_kernel(motifs, "matmul_q4_1")(x, data["q4_1"], out["matmul_q4_1"])
    # the attention motif (its own tile rows per task, vector softmax) at its fixture's 2 heads x 17 tokens
    attention = compile_command(load_files([FIXTURE.parent / "attention.loom"]), "fused")
    out["attention"] = attention.run({}, {}, {"qkv": data["qkv"], "scale": 0.2})["y"]
    return out


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                    reason="the SIMD classes compared here are x86-64's")
def test_other_simd_classes_compute_the_same_bits(rng, tmp_path):
    from numerics_testlib import random_blocks

    classes = [BASELINE] + ([AVX2] if host_has("avx512f") else [])
    data = {"a": rand(rng, 37, 101), "b": rand(rng, 29, 101), "a_wide": rand(rng, 100, 130), "b_wide": rand(rng, 600, 130), "x": rand(rng, 9, 96, scale=3.0),
            "w": rand(rng, 96), "bias": rand(rng, 96), "q4_1": random_blocks(rng, "q4_1", (13, 96)),
            "qkv": rand(rng, 2 * 17, 3 * 2 * 24)}
    assert_same_bits_in_classes(classes, "test_matmul_motif:compute_everything", data, compute_everything(data), tmp_path)

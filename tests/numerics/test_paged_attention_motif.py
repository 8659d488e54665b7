"""The `attention_paged` motif: causal grouped-query attention over the paged cache, computed as
the `attention` motif computes one sequence, so prefill and decode give the same bits.

docs/language.md §11: token t of a row, at position p, gets what the `attention` motif gives
the last of p + 1 tokens whose keys and values are its row's cache entries 0..p (its query
head's kv head) and whose last query is its own. That is the reference here, bit for bit; it
is itself checked against bmm, softmax_scaled and bmm (test_attention_motif.py). The std
kernel `paged_attention` (online softmax) checks the paging, masking and grouping within
rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numerics_testlib import AVX2, BASELINE, assert_same_bits_in_classes

from loomc.check import load_files
from loomc.lower import attention
from loomc.run.compile import compile_command, compile_kernel
from loomc.run.dispatch import DispatchError

FIXTURE = Path(__file__).parent / "fixtures" / "paged_attention.loom"
LAYERS, LAYER = 3, 1


@pytest.fixture(scope="module")
def programs() -> dict:
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    return {name: compile_command(checked, name) for name in ("tiled", "online", "tiled_f16v")}


def cache(rng, rows: int, pages_per_row: int, page_size: int, kv_dim: int):
    """Random caches (every slot finite, written or not: a key a token must not see would show)
    and page tables over shuffled pages, one -1 (no page) past each row's last."""
    n = rows * pages_per_row + 2
    k = rng.standard_normal((n, LAYERS, page_size, kv_dim)).astype(np.float32)
    v = rng.standard_normal((n, LAYERS, page_size, kv_dim)).astype(np.float32)
    table = np.full((rows, pages_per_row + 1), -1, np.int32)
    table[:, :pages_per_row] = rng.permutation(n)[:rows * pages_per_row].reshape(rows, pages_per_row)
    return k, v, table


def call(program, q, rows, positions, table, k, v, heads, kv_heads, layer=LAYER):
    scale = float(np.float32((q.shape[1] // heads) ** -0.5))
    return program.run({}, {}, {"q": q, "rows": np.asarray(rows, np.int32), "positions": np.asarray(positions, np.int32),
                                "page_table": table, "k_cache": k, "v_cache": v, "layer": layer, "heads": heads,
                                "kv_heads": kv_heads, "scale": scale})["o"]


def reference(q, rows, positions, table, k, v, heads, kv_heads):
    """Each (token, head): the `attention` motif's last row over the token's keys 0..p."""
    fused = attention.load_function()
    e = q.shape[1] // heads
    scale = float(np.float32(e ** -0.5))
    page_size = k.shape[2]
    out = np.zeros_like(q)
    for t, (row, p) in enumerate(zip(rows, positions)):
        slots = [(table[row, n // page_size], n % page_size) for n in range(p + 1)]
        for h in range(heads):
            g = h // (heads // kv_heads)
            qkv = np.zeros((p + 1, 3 * e), np.float32)
            qkv[:, :e] = q[t, h * e:(h + 1) * e]
            qkv[:, e:2 * e] = [k[page, LAYER, s, g * e:(g + 1) * e] for page, s in slots]
            qkv[:, 2 * e:] = [v[page, LAYER, s, g * e:(g + 1) * e] for page, s in slots]
            y = np.zeros((p + 1, e), np.float32)
            fused(qkv, y, 1, p + 1, scale, np.zeros(attention.workspace_elems(1, p + 1, 1, e), np.float32))
            out[t, h * e:(h + 1) * e] = y[-1]
    return out


# (heads, kv_heads, features per head, page size, tokens): grouped 3:1 like scout, 1:1, 4:1 with odd
# heads of 5, pages of 16 (scout's) and 8, prefixes longer than a 32-key block of partial sums
SHAPES = [(9, 3, 64, 16, 40), (2, 2, 8, 16, 70), (4, 1, 5, 8, 23)]


@pytest.mark.parametrize("heads, kv_heads, e, page_size, tokens", SHAPES)
def test_each_token_is_the_attention_motif_over_its_prefix_bit_for_bit(programs, rng, heads, kv_heads, e, page_size, tokens):
    k, v, table = cache(rng, 1, -(-tokens // page_size), page_size, kv_heads * e)
    q = rng.standard_normal((tokens, heads * e)).astype(np.float32)
    rows, positions = [0] * tokens, list(range(tokens))
    got = call(programs["tiled"], q, rows, positions, table, k, v, heads, kv_heads)
    np.testing.assert_array_equal(got, reference(q, rows, positions, table, k, v, heads, kv_heads))


def test_one_chunk_several_chunks_and_decode_steps_give_the_same_bits(programs, rng):
    # a decode token's 3 lanes run the few-lane path (keys, then features, in the vectors); a
    # chunk's 16 the tile: the same chains
    heads, kv_heads, e, tokens = 9, 3, 64, 45
    k, v, table = cache(rng, 1, 3, 16, kv_heads * e)
    q = rng.standard_normal((tokens, heads * e)).astype(np.float32)
    whole = call(programs["tiled"], q, [0] * tokens, range(tokens), table, k, v, heads, kv_heads)
    for chunk in (7, 1):
        parts = [call(programs["tiled"], q[s:s + chunk], [0] * len(q[s:s + chunk]), range(s, s + len(q[s:s + chunk])),
                      table, k, v, heads, kv_heads) for s in range(0, tokens, chunk)]
        np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_a_few_lane_task_of_two_tokens_sees_each_token_s_own_prefix(programs, rng):
    # 4 heads over 2 kv heads of 16 features: two tokens of a chunk are 4 lanes, the few-lane
    # path (each lane's scores a row of keys); the first token must not see the second's key
    heads, kv_heads, e, tokens = 4, 2, 16, 37
    k, v, table = cache(rng, 1, 3, 16, kv_heads * e)
    q = rng.standard_normal((tokens, heads * e)).astype(np.float32)
    pairs = [call(programs["tiled"], q[s:s + 2], [0] * len(q[s:s + 2]), range(s, s + len(q[s:s + 2])), table, k, v,
                  heads, kv_heads) for s in range(0, tokens, 2)]
    np.testing.assert_array_equal(np.concatenate(pairs), reference(q, [0] * tokens, range(tokens), table, k, v, heads,
                                                                    kv_heads))


@pytest.mark.parametrize("program", ["tiled", "tiled_f16v"])
@pytest.mark.parametrize("per_group, e", [(1, 80), (2, 16), (3, 64), (4, 32)])
def test_decode_tokens_of_one_to_four_heads_per_kv_head_are_the_motif_bit_for_bit(programs, rng, program, per_group, e):
    # one token per call: a task of per_group lanes, each lane count compiled on its own (no
    # chain for an idle lane); 80 features are value chains in a group of 64 and one of 16
    kv_heads, tokens = 2, 35
    heads = per_group * kv_heads
    k, v, table = cache(rng, 1, 3, 16, kv_heads * e)
    v16 = v.astype(np.float16)
    q = rng.standard_normal((tokens, heads * e)).astype(np.float32)
    values = v16 if program == "tiled_f16v" else v16.astype(np.float32)
    steps = [call(programs[program], q[t:t + 1], [0], [t], table, k, values, heads, kv_heads) for t in range(tokens)]
    want = reference(q, [0] * tokens, range(tokens), table, k, v16.astype(np.float32), heads, kv_heads)
    np.testing.assert_array_equal(np.concatenate(steps), want)


def test_a_decode_token_past_a_missing_page_gets_the_bits_the_tile_gives_it(programs, rng):
    # alone, a token's 3 lanes take the few-lane path with a masked page; packed with four more
    # tokens of its row, 15 lanes take the tile
    heads, kv_heads, e = 9, 3, 64
    k, v, table = cache(rng, 1, 4, 16, kv_heads * e)
    table[0, 1] = -1
    positions = [50, 51, 52, 53, 54]
    q = rng.standard_normal((len(positions), heads * e)).astype(np.float32)
    packed = call(programs["tiled"], q, [0] * len(positions), positions, table, k, v, heads, kv_heads)
    alone = [call(programs["tiled"], q[t:t + 1], [0], positions[t:t + 1], table, k, v, heads, kv_heads)
             for t in range(len(positions))]
    np.testing.assert_array_equal(np.concatenate(alone), packed)
    assert packed.all()


def test_a_row_gives_the_same_bits_alone_or_packed_with_other_rows(programs, rng):
    # three rows: a prefill chunk in the middle of its prompt, and two decode tokens, their
    # tokens interleaved in the pack
    heads, kv_heads, e = 9, 3, 64
    k, v, table = cache(rng, 3, 3, 16, kv_heads * e)
    rows = [1, 0, 1, 1, 2, 1, 1, 1, 1, 1, 1]
    positions = [20, 33, 21, 22, 7, 23, 24, 25, 26, 27, 28]
    q = rng.standard_normal((len(rows), heads * e)).astype(np.float32)
    packed = call(programs["tiled"], q, rows, positions, table, k, v, heads, kv_heads)
    for row in range(3):
        mine = [t for t, r in enumerate(rows) if r == row]
        alone = call(programs["tiled"], q[mine], [row] * len(mine), [positions[t] for t in mine], table, k, v, heads, kv_heads)
        np.testing.assert_array_equal(alone, packed[mine])
    np.testing.assert_array_equal(packed, reference(q, rows, positions, table, k, v, heads, kv_heads))


def test_is_paged_attention_within_rounding_missing_pages_and_bad_rows_included(programs, rng):
    heads, kv_heads, e = 6, 2, 16
    k, v, table = cache(rng, 2, 4, 16, kv_heads * e)
    table[1, 1] = -1                       # row 1's keys 16..31 have no page: skipped
    table[0, 2] = k.shape[0]               # an id past the pool: skipped too
    rows = [0, 0, 1, 1, 5, -1, 0]          # rows 5 and -1 do not exist: zeros
    positions = [40, 70, 17, 50, 3, 3, 80]  # 70: its fifth page is -1; 80 is past the table: zeros
    q = rng.standard_normal((len(rows), heads * e)).astype(np.float32)
    got = call(programs["tiled"], q, rows, positions, table, k, v, heads, kv_heads)
    want = call(programs["online"], q, rows, positions, table, k, v, heads, kv_heads)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert got[:4].all(axis=1).all()
    assert not got[4:].any()


def test_a_layer_outside_the_cache_gives_zeros(programs, rng):
    k, v, table = cache(rng, 1, 1, 16, 8)
    q = rng.standard_normal((3, 16)).astype(np.float32)
    assert not call(programs["tiled"], q, [0, 0, 0], [0, 1, 2], table, k, v, 2, 1, layer=LAYERS).any()


def test_shapes_its_signature_cannot_check_are_refused_with_the_source_line(programs, rng):
    k, v, table = cache(rng, 1, 1, 16, 8)
    q = rng.standard_normal((2, 24)).astype(np.float32)
    with pytest.raises(DispatchError, match=r"attention_paged at .*paged_attention\.loom:7: 24 query features are not 3 heads"):
        call(programs["tiled"], q, [0, 0], [0, 1], table, k, v, 3, 2)
    with pytest.raises(DispatchError, match=r"the cache's 8 features are not 2 kv heads of 12"):
        call(programs["tiled"], q, [0, 0], [0, 1], table, k, v, 2, 2)


def compute_classes(data: dict) -> dict:
    """The motif on `data`, for the SIMD-class comparison (here and in a subprocess): f32
    values, and the same values rounded to f16 (widened by vcvtph2ps with F16C, by integer
    operations in the baseline build)."""
    checked = load_files([FIXTURE])
    tiled, f16v = compile_command(checked, "tiled"), compile_command(checked, "tiled_f16v")
    args = (data["q"], data["rows"], data["positions"], data["table"], data["k"])
    return {"o": call(tiled, *args, data["v"], 9, 3), "o_f16v": call(f16v, *args, data["v"].astype(np.float16), 9, 3)}


@pytest.mark.parametrize("heads, kv_heads, e, page_size, tokens", SHAPES)
def test_f16_values_give_the_bits_of_f32_values_holding_the_same_numbers(programs, rng, heads, kv_heads, e, page_size,
                                                                         tokens):
    """attention_paged_f16v widens each value exactly, so it is attention_paged over the f32
    values of the f16 cache: prefill, decode (the few-lane path), a missing page, and heads of
    5 features (the widening's partial vectors). Infinities and NaNs widen as themselves."""
    k, v, table = cache(rng, 2, -(-tokens // page_size), page_size, kv_heads * e)
    table[1, 0] = -1
    v16 = v.astype(np.float16)
    v16[-1, LAYER, 0, :2] = [np.inf, np.nan]   # a slot no token reads: widened, never seen
    rows = [0] * tokens + [1, 0]
    positions = list(range(tokens)) + [tokens - 1, tokens - 1]
    q = rng.standard_normal((len(rows), heads * e)).astype(np.float32)
    got = call(programs["tiled_f16v"], q, rows, positions, table, k, v16, heads, kv_heads)
    want = call(programs["tiled"], q, rows, positions, table, k, v16.astype(np.float32), heads, kv_heads)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    decode = call(programs["tiled_f16v"], q[-1:], rows[-1:], positions[-1:], table, k, v16, heads, kv_heads)
    np.testing.assert_array_equal(decode, got[-1:])


def test_the_f16v_motif_refuses_f32_values(programs, rng):
    k, v, table = cache(rng, 1, 1, 16, 8)
    q = rng.standard_normal((2, 16)).astype(np.float32)
    with pytest.raises(Exception, match=r"v_cache|f16"):
        call(programs["tiled_f16v"], q, [0, 0], [0, 1], table, k, v, 2, 1)


def test_rope_kv_write_f16v_writes_rope_kv_writes_values_rounded_once_to_f16(rng):
    """The same q and keys as rope_kv_write, and each value its f32 value rounded to nearest
    f16 (ties to even: numpy's astype), written where rope_kv_write writes it."""
    std = load_files(sorted((Path(__file__).resolve().parents[2] / "loomc" / "motifs").glob("*.loom")))
    plain, half = compile_kernel(std, "rope_kv_write"), compile_kernel(std, "rope_kv_write_f16v")
    heads, kv_heads, e = 9, 3, 64
    qkv = (rng.standard_normal((5, (heads + 2 * kv_heads) * e)) * 3).astype(np.float32)
    qkv[0, heads * e + kv_heads * e] = np.float32(1.0009765625 + 2.0 ** -11)   # a tie: rounds to even
    rows, positions = np.array([0, 0, 0, 1, 1], np.int32), np.array([0, 1, 2, 5, 6], np.int32)
    table = np.array([[2, -1], [0, 1]], np.int32)
    out = {}
    for name, kernel, vtype in (("plain", plain, np.float32), ("half", half, np.float16)):
        k_cache = np.zeros((3, LAYERS, 4, kv_heads * e), np.float32)
        v_cache = np.zeros((3, LAYERS, 4, kv_heads * e), vtype)
        q = np.zeros((5, heads * e), np.float32)
        kernel(qkv, rows, positions, table, LAYER, heads, kv_heads, np.float32(10000.0), q, k_cache, v_cache)
        out[name] = q, k_cache, v_cache
    np.testing.assert_array_equal(out["half"][0], out["plain"][0])
    np.testing.assert_array_equal(out["half"][1], out["plain"][1])
    np.testing.assert_array_equal(out["half"][2].view(np.uint16), out["plain"][2].astype(np.float16).view(np.uint16))
    assert out["half"][2][2, LAYER, 0, 0] == np.float16(1.001953125)   # the tie, to the even neighbour (1 + 2 ulp)


def test_rope_kv_write_f16v_table_is_rope_kv_write_f16v_with_the_rotation_computed_once(rng):
    """rope_table's cos and sin, read by rope_kv_write_f16v_table, give q and the caches the
    bits rope_kv_write_f16v computes per layer; a table of the wrong width writes nothing."""
    std = load_files(sorted((Path(__file__).resolve().parents[2] / "loomc" / "motifs").glob("*.loom")))
    per_layer, table_kernel = compile_kernel(std, "rope_kv_write_f16v"), compile_kernel(std, "rope_kv_write_f16v_table")
    rope_table = compile_kernel(std, "rope_table")
    heads, kv_heads, e = 9, 3, 64
    qkv = (rng.standard_normal((5, (heads + 2 * kv_heads) * e)) * 3).astype(np.float32)
    rows, positions = np.array([0, 0, 0, 1, 1], np.int32), np.array([0, 1, 2, 5, 4000], np.int32)
    pages = np.array([[2, -1], [0, 1]], np.int32)

    def caches():
        return (np.zeros((5, heads * e), np.float32), np.zeros((3, LAYERS, 4, kv_heads * e), np.float32),
                np.zeros((3, LAYERS, 4, kv_heads * e), np.float16))

    want = caches()
    per_layer(qkv, rows, positions, pages, LAYER, heads, kv_heads, np.float32(100000.0), *want)
    cs = np.zeros((5, e), np.float32)
    rope_table(positions, np.float32(100000.0), cs)
    got = caches()
    table_kernel(qkv, rows, positions, pages, cs, LAYER, heads, kv_heads, *got)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    assert got[1].any() and got[2].any()
    wrong = caches()
    table_kernel(qkv, rows, positions, pages, np.zeros((5, e // 2), np.float32), LAYER, heads, kv_heads, *wrong)
    assert not any(a.any() for a in wrong)


def test_every_simd_class_gives_the_same_bits(rng, tmp_path):
    # the AVX2 build runs tiles of 6 keys (a page of 16: 6, 6 and a partial 4) and 6 features;
    # the baseline build has no fma instruction (the correctly rounded library fma)
    k, v, table = cache(rng, 2, 2, 16, 192)
    data = {"q": rng.standard_normal((5, 576)).astype(np.float32), "rows": np.array([0, 0, 0, 1, 0], np.int32),
            "positions": np.array([17, 18, 19, 30, 20], np.int32), "table": table, "k": k, "v": v}
    assert_same_bits_in_classes([BASELINE, AVX2], "test_paged_attention_motif:compute_classes", data,
                                compute_classes(data), tmp_path)

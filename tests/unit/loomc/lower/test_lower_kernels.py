"""Lowering kernels to IR: typing, flat indices, quantized reads, parts, and the lanes pass."""

import pytest

from loomc.check import load_files
from loomc.ir import module as ir
from loomc.ir.printer import group as print_group
from loomc.lower.kernels import lower_kernel
from loomc.ir.verifier import verify_group
from loomc.lower.jam import jam_group
from loomc.lower.lanes import reduction, rewrite, split_group
from loomc.lower.scalars import LoweringError
from loomc.syntax import ast


def lower(tmp_path, source: str, name: str, optimize: bool = True) -> ir.KernelGroup:
    path = tmp_path / "k.loom"
    path.write_text(source)
    checked = load_files([path])
    assert checked.ok, [d.message for d in checked.diagnostics]
    info = checked.modules[0]
    return lower_kernel(checked.core, info, info.decls[name], optimize=optimize)


def find(e, kind):
    found = []
    rewrite(e, lambda x: found.append(x) if isinstance(x, kind) else None)
    return found


def walk(body):
    for s in body:
        yield s
        for inner in ("body", "then", "orelse"):
            yield from walk(getattr(s, inner, ()))


def test_configs_fold_and_symbols_come_from_shapes(tmp_path):
    g = lower(tmp_path, "config eps: f32 = 0.5\nkernel k(x: f32[T, D], out y: f32[T, D]) {\n"
                        "    parallel for t in 0..T, d in 0..D {\n        y[t, d] = x[t, d] + eps\n    }\n}\n", "k")
    (k,) = g.parts
    assert [(s.name, s.buffer, s.axis) for s in k.symbols] == [("D", "x", 1), ("T", "x", 0)]
    store = next(s for s in walk(k.body) if isinstance(s, ir.Store))
    assert store.index == ir.Binary("add", ir.Binary("mul", ir.Ref("t", "i64"), ir.Ref("D", "i64"), "i64"),
                                    ir.Ref("d", "i64"), "i64")
    assert store.value.b == ir.Const("f32", 0.5)
    assert g.configs == (("eps", 0.5),)


def test_untyped_literals_take_their_context(tmp_path):
    g = lower(tmp_path, "kernel k(a: u8[N], out y: u8[N]) {\n    parallel for i in 0..N {\n"
                        "        y[i] = (a[i] << 1) * 3 + 250\n    }\n}\n", "k")
    store = next(s for s in walk(g.parts[0].body) if isinstance(s, ir.Store))
    assert store.value.dtype == "u8" and store.value.b == ir.Const("u8", 250)
    assert store.value.a.a == ir.Binary("shl", ir.Load("a", ir.Ref("i", "i64"), "u8"), ir.Const("u8", 1), "u8")


def test_quantized_index_reads_blocks(tmp_path):
    g = lower(tmp_path, "kernel k(w: q4_0[N, K], out y: f32[N, K]) {\n    parallel for n in 0..N, k in 0..K {\n"
                        "        y[n, k] = w[n, k]\n    }\n}\n", "k")
    text = print_group(g)
    assert "qscale(w, (n * (K >> 5:i64)) + (k >> 5:i64))" in text
    assert "qcode(w, (n * (K >> 5:i64)) + (k >> 5:i64), (k >> 4:i64) & 1:i64, k & 15:i64) - 8:i32" in text


def test_each_parallel_loop_is_a_part_and_lets_are_shared(tmp_path):
    g = lower(tmp_path, "kernel k(x: f32[N], out y: f32[N]) {\n    let two = 2.0\n"
                        "    parallel for i in 0..N {\n        y[i] = x[i] * two\n    }\n"
                        "    parallel for i in 0..N {\n        y[i] = y[i] + two\n    }\n}\n", "k")
    assert [k.name for k in g.parts] == ["k", "k__1"]
    for k in g.parts:
        assert isinstance(k.body[0], ir.Declare) and k.body[0].name == "two"


def test_a_top_level_var_cannot_cross_parallel_loops(tmp_path):
    src = ("kernel k(x: f32[N], out y: f32[N]) {\n    var s: f32 = 0.0\n    s = x[0]\n"
           "    parallel for i in 0..N {\n        y[i] = s\n    }\n}\n")
    with pytest.raises(LoweringError, match="'s' is declared at the top level"):
        lower(tmp_path, src, "k")


def test_a_symbol_never_alone_in_a_dimension_is_an_error(tmp_path):
    with pytest.raises(LoweringError, match="symbol 'M' of kernel 'k' is never a whole dimension"):
        lower(tmp_path, "kernel k(x: f32[2 * M], out y: f32[2 * M]) {\n    parallel for i in 0..2 * M {\n"
                        "        y[i] = x[i]\n    }\n}\n", "k")


def test_sibling_scopes_get_unique_names(tmp_path):
    g = lower(tmp_path, "kernel k(x: f32[N], out y: f32[N]) {\n    parallel for i in 0..N {\n"
                        "        if x[i] > 0.0 {\n            let v = 1.0\n            y[i] = v\n        } else {\n"
                        "            let v = 2\n            y[i] = f32(v)\n        }\n    }\n}\n", "k")
    decls = [s for s in walk(g.parts[0].body) if isinstance(s, ir.Declare)]
    assert [(d.name, d.dtype) for d in decls] == [("v", "f32"), ("v_1", "i64")]


DOT = ("kernel k(x: f32[T, K], w: q4_1[N, K], out y: f32[T, N]) {\n    parallel for t in 0..T, n in 0..N {\n"
       "        var acc: f32 = 0.0\n        for k in 0..K {\n            let a = x[t, k]\n"
       "            acc += a * w[n, k]\n        }\n        y[t, n] = acc\n    }\n}\n")


def test_lanes_pass_splits_sum_reductions(tmp_path):
    plain = lower(tmp_path, DOT, "k", optimize=False)
    loop = next(s for s in walk(plain.parts[0].body) if isinstance(s, ir.For))
    assert reduction(loop) == {"acc": "f32"}
    split = split_group(plain)
    verify_group(split)
    loops = [s for s in walk(split.parts[0].body) if isinstance(s, ir.For)]
    # whole blocks: one loop of 16 constant trips over both halves; then the ragged last chunk
    assert [(l.var, l.step) for l in loops][:5] == [("k0", 32), ("k_lane", 1), ("k0_1", 32), ("k_lane_1", 1),
                                                    ("k_lane_2", 1)]
    assert loops[0].end == ir.Ref("k_full", "i64") and loops[1].end == ir.Const("i64", 16)
    assert loops[2].start == ir.Ref("k_full", "i64") and loops[2].end == ir.Ref("k_end", "i64")
    assert isinstance(loops[3].end, ir.Ref) and isinstance(loops[4].end, ir.Ref)  # min(16, end - base) trips
    assert [l.end.value for l in loops[5:]] == [16, 8, 4, 2, 1]  # the lanes are added as a pairwise tree
    codes = [(s.index, e) for s in walk(split.parts[0].body) if isinstance(s, ir.Store) and s.buf == "acc_lanes"
             for e in find(s.value, ir.QuantCode)]
    lane, sixteen = ir.Ref("k_lane", "i64"), ir.Const("i64", 16)
    # fused: lane l of both halves reads code byte l (low and high nibble), into lanes l and 16 + l
    assert codes[:2] == [(lane, ir.QuantCode("w", codes[0][1].block, ir.Const("i64", 0), lane)),
                         (ir.Binary("add", sixteen, lane, "i64"),
                          ir.QuantCode("w", codes[0][1].block, ir.Const("i64", 1), lane))]
    assert [c.sub for _, c in codes[2:]] == [ir.Const("i64", 0), ir.Const("i64", 1)]  # block halves, not k >> 4
    assert [c.lane for _, c in codes[2:]] == [ir.Ref("k_lane_1", "i64"), ir.Ref("k_lane_2", "i64")]


def test_lanes_pass_reads_q8_blocks_in_one_flat_loop(tmp_path):
    split = lower(tmp_path, DOT.replace("q4_1", "q8_0"), "k")
    loops = [s for s in walk(split.parts[0].body) if isinstance(s, ir.For)]
    flat = next(l for l in loops if l.end == ir.Const("i64", 32))
    codes = [c for s in walk(flat.body) for c in find(getattr(s, "value", ir.Const("i64", 0)), ir.QuantCode)]
    lane = ir.Ref(flat.var, "i64")
    assert len(codes) == 2  # the first loop is a whole tile's: two rows of weights
    assert all(c.sub == ir.Binary("shr", lane, ir.Const("i64", 4), "i64") for c in codes)
    assert all(c.lane == ir.Binary("and", lane, ir.Const("i64", 15), "i64") for c in codes)


def test_lanes_pass_keeps_runtime_trip_counts_without_quantized_reads(tmp_path):
    """A light body (an f32 dot product) would be unrolled whole at constant trip counts."""
    split = lower(tmp_path, DOT.replace("w: q4_1[N, K]", "w: f32[N, K]"), "k")
    loops = [s for s in walk(split.parts[0].body) if isinstance(s, ir.For)]
    assert [(l.var, l.step) for l in loops][:3] == [("k0", 32), ("k_lane", 1), ("k_lane_1", 1)]
    assert loops[0].end == ir.Ref("k_end", "i64") and isinstance(loops[1].end, ir.Ref)


def test_jam_pass_shares_dequantization_across_four_tokens(tmp_path):
    jammed = jam_group(lower(tmp_path, DOT, "k", optimize=False))
    verify_group(jammed)
    (lane_loop,) = [s for s in jammed.parts[0].body if isinstance(s, ir.ParallelFor)]
    assert [l.var for l in lane_loop.lanes] == ["n_pair", "t_block"]  # token tiles vary fastest
    tile, (per_row,) = lane_loop.body[2].then, lane_loop.body[2].orelse
    # not a whole tile: the token-blocked body once per row, n = n_first + n_j
    assert isinstance(per_row.end, ir.Math) and per_row.body[0] == ir.Declare(
        "n", "i64", ir.Binary("add", ir.Ref("n_first", "i64"), ir.Ref(per_row.var, "i64"), "i64"))
    full, ragged = per_row.body[1].then, per_row.body[1].orelse
    assert [s.name for s in full if isinstance(s, ir.Declare) and s.mutable] == ["acc_0", "acc_1", "acc_2", "acc_3"]
    (k_loop,) = [s for s in full if isinstance(s, ir.For)]
    updates = [s for s in k_loop.body if isinstance(s, ir.Assign)]
    assert len(updates) == 4 and len({str(find(u.value, ir.QuantScale)) for u in updates}) == 1
    assert isinstance(ragged[0], ir.For) and isinstance(ragged[0].end, ir.Math)  # min(4, T - first): T % 4, T < 4


def test_jam_pass_pairs_rows_so_a_whole_tile_reads_each_activation_once(tmp_path):
    jammed = jam_group(lower(tmp_path, DOT, "k", optimize=False))
    (lane_loop,) = [s for s in jammed.parts[0].body if isinstance(s, ir.ParallelFor)]
    branch = lane_loop.body[2]
    assert isinstance(branch.cond, ir.Binary) and branch.cond.op == "land"  # whole tokens and whole rows
    (k_loop,) = [s for s in branch.then if isinstance(s, ir.For)]
    lets = [s for s in k_loop.body if isinstance(s, ir.Declare)]
    updates = [s for s in k_loop.body if isinstance(s, ir.Assign)]
    assert len(updates) == 8  # 4 tokens x 2 rows
    x_reads = [d for d in lets if find(d.value, ir.Load)]
    decoded = [d for d in lets if find(d.value, ir.QuantScale)]
    assert len(x_reads) == 4 and len(decoded) == 2  # one load per token, one decode per row, shared by the tile
    stores = [s for s in branch.then if isinstance(s, ir.Store)]
    assert len(stores) == 8 and len({s.index for s in stores}) == 8


def test_fma_updates_are_reductions_whose_lanes_keep_the_fma(tmp_path):
    src = DOT.replace("acc += a * w[n, k]", "acc = fma(a, w[n, k], acc)")
    plain = lower(tmp_path, src, "k", optimize=False)
    loop = next(s for s in walk(plain.parts[0].body) if isinstance(s, ir.For))
    assert reduction(loop) == {"acc": "f32"}
    split = split_group(plain)
    verify_group(split)
    stores = [s for s in walk(split.parts[0].body) if isinstance(s, ir.Store) and s.buf == "acc_lanes"]
    updates = [s for s in stores if isinstance(s.value, ir.Math)]
    assert len(updates) == 4  # both halves of the whole-block loop and of the ragged one
    assert all(u.value.fn == "fma" and u.value.args[2] == ir.Load("acc_lanes", u.index, "f32") for u in updates)
    assert all(isinstance(s.value, ir.Binary) and s.value.op == "add" for s in stores if s not in updates)  # the tree
    jammed = jam_group(plain)
    (lane_loop,) = [s for s in jammed.parts[0].body if isinstance(s, ir.ParallelFor)]
    (k_loop,) = [s for s in lane_loop.body[2].then if isinstance(s, ir.For)]
    fmas = [s for s in k_loop.body if isinstance(s, ir.Assign)]
    assert [s.value.fn for s in fmas] == ["fma"] * 8 and len({s.value.args[1] for s in fmas}) == 2  # a weight per row


@pytest.mark.parametrize("update", ["acc = fma(a, w[n, k], 0.0)", "acc = fma(acc, w[n, k], acc)",
                                    "acc = fma(a, acc, acc)"])
def test_other_fma_uses_are_not_reductions(tmp_path, update):
    plain = lower(tmp_path, DOT.replace("acc += a * w[n, k]", update), "k", optimize=False)
    loop = next(s for s in walk(plain.parts[0].body) if isinstance(s, ir.For))
    assert reduction(loop) is None


def test_jam_pass_leaves_kernels_without_quantized_reads_alone(tmp_path):
    src = DOT.replace("w: q4_1[N, K]", "w: f32[N, K]")
    plain = lower(tmp_path, src, "k", optimize=False)
    assert jam_group(plain) == plain


@pytest.mark.parametrize("body", [
    "acc += x[t, k]\n            acc += 1.0",  # two updates of one accumulator
    "acc = acc * x[t, k]",  # not a sum
    "if k > 2 {\n                acc += x[t, k]\n            }",  # conditional
    "acc += x[t, k] * acc",  # reads the accumulator
])
def test_lanes_pass_leaves_other_loops_alone(tmp_path, body):
    src = ("kernel k(x: f32[T, K], out y: f32[T]) {\n    parallel for t in 0..T {\n        var acc: f32 = 0.0\n"
           f"        for k in 0..K {{\n            {body}\n        }}\n        y[t] = acc\n    }}\n}}\n")
    split = lower(tmp_path, src, "k")
    assert not any(isinstance(s, ir.LocalArray) for s in walk(split.parts[0].body))


def test_kernels_of_the_scout_sample_lower(repo):
    from loomc.check.document import load_document

    checked = load_document(repo / "samples" / "scout" / "model.json")
    kernels = [(info, item) for info in checked.modules for item in info.module.items if isinstance(item, ast.Kernel)]
    assert len(kernels) >= 11
    for info, item in kernels:
        lower_kernel(checked.core, info, item)

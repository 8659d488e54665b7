"""The attention_paged motif on the cpu target: causal grouped-query attention over the paged
KV cache on the GEMM tile, for prefill chunks and decode tokens alike.

    attention_paged(q: f32[T, QD], rows: i32[T], positions: i32[T], page_table: i32[R, P],
                    k_cache: f32[N, L, S, KD], v_cache: f32[N, L, S, KD], layer: i64,
                    heads: i64, kv_heads: i64, scale: f32, out o: f32[T, QD])

What std:attention.loom's `paged_attention` attends (token t of row rows[t] at position p =
positions[t] reads keys and values 0..p of its row through page_table, query head h reads kv
head h / (heads / kv_heads), pages with no valid id are skipped, a token with a row or
position out of range gets zeros), computed the way the `attention` motif computes one
sequence (loomc/lower/attention.py): every score one fma chain over the head's features
from +0.0, softmax_scaled's operations on `score * scale` over the keys the token sees (the
maximum, Cephes' exp clamped at -87, a sum in 32 partials by key position with their fixed
pairwise fold, one reciprocal, one multiply), then every output element one fma chain over
keys 0..p from +0.0. So a token's result is a function of its own query and its own row's
keys only: the same bits alone or packed with other rows, prefilled in one chunk, in several,
or decoded one token per step (how many tokens share its step never enters), on every SIMD
class. Equal to the `attention` motif's last row over the sequence 0..p. (One corner: a key
a token does not see but a token of the same task does enters that token's output chain as
fma(0, v, acc), which leaves acc unchanged except that a -0.0 accumulator becomes +0.0.)

`paged_attention` keeps an online softmax per (token, head) and folds each score over 32
lanes: ~250 cycles per key and head, 47 % of a 512-token prefill of scout. Here the tiles do
the work: a task takes up to 16 (token, query head) lanes of one row that share kv head g,
token-major (a decode token's heads of one group fill 3 lanes of scout's 16; a prefill chunk
fills them all) and
  scores   the GEMM tile with the lanes' queries packed as the vector side and the keys read
           in place from the cache as the broadcast side: st[n * 16 + i] = q_i . k_n
  softmax  down the columns: lane i of every key row at once, as 16-lane LLVM IR (the
           `attention` motif's passes with a maximum per lane); keys a lane does not see
           are -inf before the maximum and 0 after the exp
  values   the GEMM tile with those 16-lane rows of probabilities as the vector side (already
           the layout it reads) and the values read in place, features as rows, as the
           broadcast side, one call per page and block of features, the chains carried on
in its own buffers (scores: 64 bytes per key), so nothing is packed per call but 16 queries.
A task of at most FEW lanes (a decode token: scout's 3 heads per kv head) would leave most of
the tile's 16 lanes idle, so, when heads have a multiple of 16 features, it runs the same
chains with keys in the vector lanes for the scores (each 16 x 16 block of keys and features loaded by rows and transposed in registers)
and features in the vector lanes for the values. When every page of its keys is present, such
a task also keeps each lane's scores as one row of keys and runs the `attention` motif's row
softmax on it (`_lm_attend_rows`): the 16-lane columns spent the softmax's passes on 3 live
lanes of 16. Same bits; a hot decode call of 1 row got 10-25 % faster, one of 8 rows between
0 and 25 % depending on the caches' size (docs/performance.md, fifth Zen 5 session). Such a
task reads its queries where they are (no packing), and its chains are compiled for its exact
lane count (1 to FEW), so scout's 3 heads per kv head spend no chain on a fourth lane.
Without AVX-512 (16 ymm registers, where 16 rows of 16 keys and 12 vectors of value chains
spilled) such a task scores keys 0..7 and 8..15 of a block in turn, as 8 x 8 blocks, and
carries at most 6 vectors of value chains: the same chains, so the same bits (served at 8
rows on AVX2 code, a call 59.6-60.5 -> 48.9-57.1 us; docs/performance.md, eleventh session).

A decode step reads each layer's keys and values once, long after the step before evicted
them, so a task asks for the cache lines it will read ahead of use (`_lm_prefetch_rows`): a
tile task all of them first; a decode task the keys of its first PREFETCH_PAGES pages, then,
while it scores page pi, page pi + PREFETCH_PAGES's keys and page pi's values, so the memory
works while the scores are computed; and every task first asks for the first keys of the
task after it, most often the same thread's next. On the Zen 5 machine, 8 rows at 190
positions over layers evicted between calls: 94-121 -> 61-73 us, and 79-84 -> 77 us with the
next task's keys (docs/performance.md, seventh session).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loomc import LOOMC_VERSION
from loomc.lower import matmul
from loomc.lower.attention import SOFTMAX_ROW_SOURCE, SOFTMAX_VECTOR_SOURCE
from loomc.lower.qdot import IR_HELPERS_SOURCE

# The motifs this module serves: name -> the (keys, values) caches' dtypes. An f16 cache
# reaches the driver as its uint16 bits; each task widens what it reads of it, exactly: the
# tile's tasks into a copy of their rows, a decode task's few lanes as each row is loaded (the
# copy was 15 % of such a task; a decode call at 8 rows and 190 positions went 58 -> 55 us).
MOTIFS = {"attention_paged": ("f32", "f32"), "attention_paged_f16v": ("f32", "f16")}
LANES = 16   # (token, head) pairs per task: the tile's vector width
assert matmul.PANEL_ROWS == LANES, "the scores' rows are the tile's vectors"
# At most this many lanes (a decode token's heads of one kv head): keys or features fill the vectors
# (`_lm_scores_lanes`/`_lm_values_lanes` dispatch each count up to 4)
FEW = 4
PREFETCH_PAGES = 2   # how many pages ahead a decode task asks for the keys it will score

FEW_SOURCE = '''
from numba.extending import overload


def _lm_widen_halves(builder, bits, n):
    # <n x i16> f16 bits -> <n x f32>, exactly: vcvtph2ps with F16C; else the integer path of
    # numba_helpers' _lm_f16_from_bits (inf and nan included)
    from llvmlite import ir as llir

    f32, i32 = llir.FloatType(), llir.IntType(32)
    vf, vi = llir.VectorType(f32, n), llir.VectorType(i32, n)
    if _lm_target_has("f16c"):
        return builder.fpext(builder.bitcast(bits, llir.VectorType(llir.HalfType(), n)), vf)

    def c(x):
        return llir.Constant(vi, [x] * n)
    h = builder.zext(bits, vi)
    mag = builder.fmul(builder.bitcast(builder.shl(builder.and_(h, c(0x7FFF)), c(13)), vf),
                       llir.Constant(vf, [5.192296858534828e33] * n))
    out = builder.bitcast(mag, vi)
    special = builder.icmp_unsigned("==", builder.and_(h, c(0x7C00)), c(0x7C00))
    out = builder.select(special, builder.or_(out, c(0x7F800000)), out)
    return builder.bitcast(builder.or_(out, builder.shl(builder.and_(h, c(0x8000)), c(16))), vf)


def _lm_few_codegen(kind):
    # A decode token's few lanes (the last argument, a literal up to FEW) without the tile's
    # 16: the same chains, keys or features in the vector lanes instead of (token, head) lanes
    def codegen(context, builder, sig, args):
        from llvmlite import ir as llir

        n_lanes = sig.args[-1].literal_value

        f32, i32, i64 = llir.FloatType(), llir.IntType(32), llir.IntType(64)
        vec = llir.VectorType(f32, 16)
        fma = cgutils.get_or_insert_function(builder.module, llir.FunctionType(vec, [vec] * 3), "llvm.fma.v16f32")
        zero = llir.Constant(vec, [0.0] * 16)
        values = _lm_arguments(context, builder, sig, args)

        def data(k):
            return context.make_array(sig.args[k])(context, builder, values[k]).data

        def c64(x):
            return llir.Constant(i64, x)

        def vload(ptr):
            return builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4)

        def vstore(v, ptr):
            builder.store(v, builder.bitcast(ptr, vec.as_pointer()), align=4)

        def splat(ptr, vector=vec):   # the float at ptr in every lane (a broadcast from memory)
            x = builder.load(ptr, align=4)
            lanes = llir.VectorType(i32, vector.count)
            return builder.shuffle_vector(builder.insert_element(llir.Constant(vector, None), x, llir.Constant(i32, 0)),
                                          llir.Constant(vector, None), llir.Constant(lanes, [0] * vector.count))

        def transposed(v):
            # n vectors of n lanes, rows of a block, as its n columns: the off-diagonal h x h
            # blocks swapped for h = n / 2 .. 1, in registers
            n = len(v)
            lanes, h = llir.VectorType(i32, n), n // 2
            while h:
                new = list(v)
                for r in range(n):
                    if (r // h) % 2 == 0:
                        lo = [l if (l // h) % 2 == 0 else n + l - h for l in range(n)]
                        hi = [l + h if (l // h) % 2 == 0 else n + l for l in range(n)]
                        new[r] = builder.shuffle_vector(v[r], v[r + h], llir.Constant(lanes, lo))
                        new[r + h] = builder.shuffle_vector(v[r], v[r + h], llir.Constant(lanes, hi))
                v, h = new, h // 2
            return v

        if kind == "scores":
            # (qf, qoff, qld, kf, base, ld, kb, E, sc, sc_off, sc_ld): sc[sc_off + i * sc_ld + j] =
            # chain over e < E of fma(qf[qoff[i] + e * qld], kf[base + j * ld + e], .) from +0.0,
            # lanes i < n_lanes, keys j < 16 (keys j >= kb: zeros). Each 16 x 16 block of keys and
            # features is loaded by rows and transposed in registers, so a vector holds one
            # feature of 16 keys.
            qf, qoffs, kf, sc = data(0), data(1), data(3), data(8)
            qld, base, ld, kb, depth, sc_off, sc_ld = (values[2], values[4], values[5], values[6], values[7],
                                                       values[9], values[10])
            qoff = [builder.load(builder.gep(qoffs, [c64(i)])) for i in range(n_lanes)]
            live = [builder.icmp_signed("<", c64(j), kb) for j in range(16)]
            rows = [builder.gep(kf, [builder.add(base, builder.mul(builder.select(live[j], c64(j), c64(0)), ld))])
                    for j in range(16)]

            if not _lm_target_has("avx512f"):
                # 16 ymm: the 16 rows of a 16 x 16 block spilled. The same chains, for keys 0..7
                # and then 8..15, each 8 x 8 block of keys and features transposed in registers
                half = llir.VectorType(f32, 8)
                fma8 = cgutils.get_or_insert_function(builder.module, llir.FunctionType(half, [half] * 3),
                                                      "llvm.fma.v8f32")
                zero8 = llir.Constant(half, [0.0] * 8)

                def key_half(kh):
                    def chunk8(c, accs):   # accs[i]: lane i's scores of keys 8 kh .. 8 kh + 7
                        new = list(accs)
                        for fh in range(2):
                            at = builder.add(builder.mul(c, c64(16)), c64(8 * fh))
                            v = transposed([builder.select(live[8 * kh + j],
                                                           builder.load(builder.bitcast(builder.gep(rows[8 * kh + j], [at]),
                                                                                        half.as_pointer()), align=4), zero8)
                                            for j in range(8)])   # v[e] = feature at + e of the 8 keys
                            for e in range(8):
                                q_at = builder.mul(builder.add(at, c64(e)), qld)
                                new = [builder.call(fma8, [splat(builder.gep(qf, [builder.add(qoff[i], q_at)]), half), v[e],
                                                           new[i]]) for i in range(n_lanes)]
                        return new
                    return chunk8

                for kh in range(2):
                    accs = _lm_vector_loop(builder, builder.sdiv(depth, c64(16)), [zero8] * n_lanes, key_half(kh))
                    for i in range(n_lanes):
                        at = builder.add(builder.add(sc_off, builder.mul(sc_ld, c64(i))), c64(8 * kh))
                        builder.store(accs[i], builder.bitcast(builder.gep(sc, [at]), half.as_pointer()), align=4)
                return context.get_dummy_value()

            def chunk(c, accs):
                off = builder.mul(c, c64(16))
                # v[e] = feature off + e of keys 0..15
                v = transposed([builder.select(live[j], vload(builder.gep(rows[j], [off])), zero) for j in range(16)])
                for e in range(16):
                    at = builder.mul(builder.add(off, c64(e)), qld)
                    accs = [builder.call(fma, [splat(builder.gep(qf, [builder.add(qoff[i], at)])), v[e], accs[i]])
                            for i in range(n_lanes)]
                return accs

            accs = _lm_vector_loop(builder, builder.sdiv(depth, c64(16)), [zero] * n_lanes, chunk)
            for i in range(n_lanes):
                vstore(accs[i], builder.gep(sc, [builder.add(sc_off, builder.mul(sc_ld, c64(i)))]))
        else:
            # (st, st_off, lane_ld, key_ld, vf, base, ld, kb, E, acc): acc[i * E + e] continues its
            # chain over keys n < kb with fma(st[st_off + i * lane_ld + n * key_ld],
            # vf[base + n * ld + e], .), lanes i < n_lanes; an f16 cache's values (uint16 bits)
            # widened as they are loaded, exactly
            st, vf, acc = data(0), data(4), data(9)
            halves = sig.args[4].dtype == types.uint16
            st_off, lane_ld, key_ld = values[1], values[2], values[3]
            base, ld, kb, depth = values[5], values[6], values[7], values[8]

            def chunks(first, width):
                # feature chunks first .. first + width of every lane, their chains carried
                # together over the keys (width x n_lanes independent chains hide the fma's latency)
                offs = [builder.mul(builder.add(first, c64(w)), c64(16)) for w in range(width)]
                slots = [builder.gep(acc, [builder.add(builder.mul(depth, c64(i)), off)])
                         for off in offs for i in range(n_lanes)]

                def key(n, accs):
                    start = builder.add(base, builder.mul(n, ld))
                    at = builder.add(st_off, builder.mul(n, key_ld))
                    p = [splat(builder.gep(st, [builder.add(at, builder.mul(lane_ld, c64(i)))]))
                         for i in range(n_lanes)]
                    out = []
                    for w, off in enumerate(offs):
                        value_at = builder.gep(vf, [builder.add(start, off)])
                        if halves:
                            bits = builder.bitcast(value_at, llir.VectorType(llir.IntType(16), 16).as_pointer())
                            row = _lm_widen_halves(builder, builder.load(bits, align=2), 16)
                        else:
                            row = vload(value_at)
                        out += [builder.call(fma, [p[i], row, accs[w * n_lanes + i]]) for i in range(n_lanes)]
                    return out

                accs = _lm_vector_loop(builder, kb, [vload(slot) for slot in slots], key)
                for slot, a in zip(slots, accs):
                    vstore(a, slot)

            blocks = builder.sdiv(depth, c64(16))
            # feature chunks carried together: 4 x n_lanes accumulators of 16 lanes fit AVX-512's
            # 32 zmm; each is two of AVX2's 16 ymm, so there at most 6 (4 x 3 spilled them)
            group = 4 if _lm_target_has("avx512f") else max(1, min(4, 6 // n_lanes))
            groups = builder.sdiv(blocks, c64(group))

            def grouped(c, unused):
                chunks(builder.mul(c, c64(group)), group)
                return unused

            def single(c, unused):
                chunks(builder.add(builder.mul(groups, c64(group)), c), 1)
                return unused

            _lm_vector_loop(builder, groups, [c64(0)], grouped)
            _lm_vector_loop(builder, builder.sub(blocks, builder.mul(groups, c64(group))), [c64(0)], single)
        return context.get_dummy_value()

    return codegen


def _lm_prefetch_codegen(context, builder, sig, args):
    # _lm_prefetch_rows(a, base, count, ld, width): a hint to fetch, into every cache level, the
    # `width` elements of each of `count` rows of flat array a from element base, ld apart
    # (one request per 64-byte line); never faults, changes no value
    from llvmlite import ir as llir

    i64 = llir.IntType(64)
    a, base, count, ld, width = _lm_arguments(context, builder, sig, args)
    data = context.make_array(sig.args[0])(context, builder, a).data
    per_line = llir.Constant(i64, 64 // (sig.args[0].dtype.bitwidth // 8))
    lines = builder.sdiv(builder.add(width, builder.sub(per_line, llir.Constant(i64, 1))), per_line)

    def row(j, unused):
        start = builder.add(base, builder.mul(j, ld))

        def line(c, unused):
            at = builder.gep(data, [builder.add(start, builder.mul(c, per_line))])
            _lm_prefetch(builder, builder.bitcast(at, llir.IntType(8).as_pointer()), 0)
            return unused

        _lm_vector_loop(builder, lines, [llir.Constant(i64, 0)], line)
        return unused

    _lm_vector_loop(builder, count, [llir.Constant(i64, 0)], row)
    return context.get_dummy_value()


@intrinsic
def _lm_prefetch_rows(typingctx, a, base, count, ld, width):
    return types.none(a, base, count, ld, width), _lm_prefetch_codegen


def _lm_widen_codegen(context, builder, sig, args):
    # _lm_widen_rows(src, base, count, ld, width, dst, at): dst[at + j * width + e] = the f32 value
    # of src[base + j * ld + e] (j < count, e < width), src an f16 cache's bits (uint16): widened
    # exactly (vcvtph2ps with F16C; else the integer path of numba_helpers' _lm_f16_from_bits,
    # inf and nan included)
    from llvmlite import ir as llir

    f32, i16, i32, i64 = llir.FloatType(), llir.IntType(16), llir.IntType(32), llir.IntType(64)
    src, base, count, ld, width, dst, at = _lm_arguments(context, builder, sig, args)
    source = context.make_array(sig.args[0])(context, builder, src).data
    target = builder.bitcast(context.make_array(sig.args[5])(context, builder, dst).data, f32.as_pointer())
    def move(from_at, to_at, n):
        bits = builder.load(builder.bitcast(builder.gep(source, [from_at]), llir.VectorType(i16, n).as_pointer()), align=2)
        value = _lm_widen_halves(builder, bits, n)
        builder.store(value, builder.bitcast(builder.gep(target, [to_at]), value.type.as_pointer()), align=4)

    chunks = builder.sdiv(width, llir.Constant(i64, 16))

    def row(j, unused):
        start = builder.add(base, builder.mul(j, ld))
        out = builder.add(at, builder.mul(j, width))

        def chunk(c, unused):
            offset = builder.mul(c, llir.Constant(i64, 16))
            move(builder.add(start, offset), builder.add(out, offset), 16)
            return unused

        def tail(e, unused):
            move(builder.add(start, e), builder.add(out, e), 1)
            return unused

        _lm_vector_loop(builder, chunks, [llir.Constant(i64, 0)], chunk)
        _lm_vector_loop(builder, builder.sub(width, builder.mul(chunks, llir.Constant(i64, 16))), [llir.Constant(i64, 0)],
                        lambda e, u: tail(builder.add(e, builder.mul(chunks, llir.Constant(i64, 16))), u))
        return unused

    _lm_vector_loop(builder, count, [llir.Constant(i64, 0)], row)
    return context.get_dummy_value()


@intrinsic
def _lm_widen_rows(typingctx, src, base, count, ld, width, dst, at):
    return types.none(src, base, count, ld, width, dst, at), _lm_widen_codegen


def _lm_f32_rows(cache, bases, nk, S, KD, E):
    pass


@overload(_lm_f32_rows)
def _lm_f32_rows_typed(cache, bases, nk, S, KD, E):
    # (array, each page's start in it, row stride) of a task's keys or values as f32: an f32
    # cache read in place; an f16 cache's (uint16 bits) rows widened once, exactly, into a copy
    if cache.dtype != types.uint16:
        return lambda cache, bases, nk, S, KD, E: (cache, bases, KD)

    def widened(cache, bases, nk, S, KD, E):
        pages = min(bases.size, (nk + S - 1) // S)   # those holding keys 0 .. nk - 1 (none for nk = 0)
        wide = np.empty(pages * S * E, np.float32)
        starts = np.full(bases.size, -1, np.int64)
        for pi in range(pages):
            if bases[pi] >= 0:
                starts[pi] = pi * S * E
                _lm_widen_rows(cache, bases[pi], min(S, nk - pi * S), KD, E, wide, starts[pi])
        return wide, starts, E

    return widened


@intrinsic
def _lm_scores_few(typingctx, qf, qoff, qld, kf, base, ld, kb, depth, sc, sc_off, sc_ld, lanes):
    if not isinstance(lanes, types.IntegerLiteral):
        return None
    return types.none(qf, qoff, qld, kf, base, ld, kb, depth, sc, sc_off, sc_ld, lanes), _lm_few_codegen("scores")


@intrinsic
def _lm_values_few(typingctx, st, st_off, lane_ld, key_ld, vf, base, ld, kb, depth, acc, lanes):
    if not isinstance(lanes, types.IntegerLiteral):
        return None
    return types.none(st, st_off, lane_ld, key_ld, vf, base, ld, kb, depth, acc, lanes), _lm_few_codegen("values")


@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_scores_lanes(lanes, qf, qoff, qld, kf, base, ld, kb, depth, sc, sc_off, sc_ld):
    # _lm_scores_few for exactly `lanes` lanes (1 .. FEW), no chain spent on an idle lane
    if lanes == 1:
        _lm_scores_few(qf, qoff, qld, kf, base, ld, kb, depth, sc, sc_off, sc_ld, 1)
    elif lanes == 2:
        _lm_scores_few(qf, qoff, qld, kf, base, ld, kb, depth, sc, sc_off, sc_ld, 2)
    elif lanes == 3:
        _lm_scores_few(qf, qoff, qld, kf, base, ld, kb, depth, sc, sc_off, sc_ld, 3)
    else:
        _lm_scores_few(qf, qoff, qld, kf, base, ld, kb, depth, sc, sc_off, sc_ld, 4)


@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_values_lanes(lanes, st, st_off, lane_ld, key_ld, vf, base, ld, kb, depth, acc):
    # _lm_values_few for exactly `lanes` lanes (1 .. FEW)
    if lanes == 1:
        _lm_values_few(st, st_off, lane_ld, key_ld, vf, base, ld, kb, depth, acc, 1)
    elif lanes == 2:
        _lm_values_few(st, st_off, lane_ld, key_ld, vf, base, ld, kb, depth, acc, 2)
    elif lanes == 3:
        _lm_values_few(st, st_off, lane_ld, key_ld, vf, base, ld, kb, depth, acc, 3)
    else:
        _lm_values_few(st, st_off, lane_ld, key_ld, vf, base, ld, kb, depth, acc, 4)
'''


_DRIVER = '''
@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_mask(st, nk, lanes, lpos, ok, S, value):
    # st[n * 16 + i] = value where lane i does not see key n: past its position, or on a page
    # with no valid id (lanes past `lanes` are padding: left alone, never stored)
    low = nk
    for i in range(lanes):
        low = min(low, lpos[i] + 1)
    for n in range(low, nk):
        for i in range(lanes):
            if n > lpos[i]:
                st[n * 16 + i] = value
    for pi in range(ok.size):
        if not ok[pi]:
            for n in range(pi * S, min(nk, pi * S + S)):
                for i in range(16):
                    st[n * 16 + i] = value


@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_attend(q, order, pair0, count, hpg, row, positions, page_table, kf, vf, N, L, S, KD, layer, g, E, scale, o):
    # one task: lanes pair0 .. pair0 + 16 of row `row`'s (token, head of group g) pairs
    lanes = min(16, count * hpg - pair0)
    tok = carray(_lm_alloca(16, np.int64), (16,))   # on the stack: a decode task is a few us
    col = carray(_lm_alloca(16, np.int64), (16,))
    lpos = carray(_lm_alloca(16, np.int64), (16,))
    for i in range(16):
        tok[i] = 0
        col[i] = 0
        lpos[i] = -1
    top_pos = 0
    for i in range(lanes):
        pair = pair0 + i
        tok[i] = order[pair // hpg]
        col[i] = (g * hpg + pair % hpg) * E
        lpos[i] = positions[tok[i]]
        top_pos = max(top_pos, lpos[i])
    nk = top_pos + 1
    pages = (nk + S - 1) // S
    # where each page's keys of kv head g start in the flat caches (-1: no valid page); a
    # decode step finds them evicted: a tile task asks for all of them at once, a decode task
    # for its first pages (the rest while it scores, _lm_attend_rows)
    bases = np.full(pages, -1, np.int64)
    few = lanes <= FEW and E % 16 == 0   # a decode token's heads: keys, not lanes, fill the vectors
    present = True
    for pi in range(pages):
        page = page_table[row, pi]
        if page >= 0 and page < N:
            bases[pi] = _lm_page_at(page, layer, g, L, S, KD, E)
            if not few or pi < PREFETCH_PAGES:
                _lm_prefetch_rows(kf, bases[pi], min(S, nk - pi * S), KD, E)
            if not few:
                _lm_prefetch_rows(vf, bases[pi], min(S, nk - pi * S), KD, E)
        else:
            present = False
    kw, kb, kl = _lm_f32_rows(kf, bases, nk, S, KD, E)
    if few and present:   # a decode token: its queries read in place, values widened as loaded
        qoff = carray(_lm_alloca(FEW, np.int64), (FEW,))
        for i in range(lanes):
            qoff[i] = tok[i] * q.shape[1] + col[i]
        _lm_attend_rows(q.reshape(-1), qoff, lanes, tok, col, lpos, nk, pages, S, kw, kb, kl, vf, bases, KD, E, scale,
                        o)
        return
    # values as f32 for the tile; `few` reads them in place, an f16 cache's widened as loaded
    vw, vb, vl = _lm_f32_rows(vf, bases, 0 if few else nk, S, KD, E)
    _lm_attend_keys(q, lanes, tok, col, lpos, nk, pages, S, kw, vw, kb, kl, vb, vl, vf, few, E, scale, o)


@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_page_at(page, layer, g, L, S, KD, E):
    # where kv head g's features of `page`'s first slot in `layer` start in a flat cache
    return ((page * L + layer) * S) * KD + g * E


@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_ask_first_pages(kf, page_table, row, g, N, L, S, KD, layer, E):
    # the keys of kv head g in the first PREFETCH_PAGES pages of `row` (whole pages)
    for pi in range(min(PREFETCH_PAGES, page_table.shape[1])):
        page = page_table[row, pi]
        if page >= 0 and page < N:
            _lm_prefetch_rows(kf, _lm_page_at(page, layer, g, L, S, KD, E), S, KD, E)


@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_attend_rows(qf, qoff, lanes, tok, col, lpos, nk, pages, S, kf, bases, ld, cache, vbases, vld, E, scale, o):
    # a few-lane task with every page present: lane i's query at qf[qoff[i] ..], its scores one
    # row of keys, st[i * kp + n], softmax_scaled as the `attention` motif runs a row
    # (_lm_softmax_row, in whole vectors past the lane's keys), then its keys past its position
    # 0, as the tile's masks leave them. Page pi + PREFETCH_PAGES's keys and page pi's values are
    # asked for while page pi is scored: the first pages' keys were asked for by the caller
    kp = pages * S + 16   # a block's store of 16 keys, and the softmax's last vector, stay inside the row
    st = np.empty(FEW * kp, np.float32)
    for pi in range(pages):
        kb = min(S, nk - pi * S)
        if pi + PREFETCH_PAGES < pages:
            _lm_prefetch_rows(kf, bases[pi + PREFETCH_PAGES], min(S, nk - (pi + PREFETCH_PAGES) * S), ld, E)
        _lm_prefetch_rows(cache, vbases[pi], kb, vld, E)
        for j0 in range(0, kb, 16):
            _lm_scores_lanes(lanes, qf, qoff, 1, kf, bases[pi] + j0 * ld, ld, min(16, kb - j0), E, st, pi * S + j0, kp)
    for i in range(lanes):
        _lm_softmax_row(st, i * kp, lpos[i] + 1, scale, kp - lpos[i] - 1)
        for n in range(lpos[i] + 1, nk):
            st[i * kp + n] = np.float32(0.0)
    acc = np.zeros(FEW * E, np.float32)
    for pi in range(pages):
        _lm_values_lanes(lanes, st, pi * S, kp, 1, cache, vbases[pi], vld, min(S, nk - pi * S), E, acc)
    for i in range(lanes):
        for e in range(E):
            o[tok[i], col[i] + e] = acc[i * E + e]


@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_attend_keys(q, lanes, tok, col, lpos, nk, pages, S, kf, vf, bases, ld, vbases, vld, cache, few, E, scale, o):
    # the task's lanes against f32 keys and values: page pi's key j at kf[bases[pi] + j * ld],
    # its value at vf[vbases[pi] + j * vld] (`few`: at cache[bases[pi] + j * ld], the values'
    # cache itself)
    qp = np.zeros(E * 16, np.float32)
    for e in range(E):
        for i in range(lanes):
            qp[e * 16 + i] = q[tok[i], col[i] + e]
    ok = np.zeros(pages, np.bool_)
    for pi in range(pages):
        ok[pi] = bases[pi] >= 0
    lane_at = carray(_lm_alloca(FEW, np.int64), (FEW,))   # lane i's features in qp: i, 16 apart
    for i in range(FEW):
        lane_at[i] = i
    # the scores, st[n * 16 + i] = q_i . k_n: one fma chain over e from +0.0 per element
    st = np.zeros(pages * S * 16, np.float32)
    sc = np.zeros(FEW * 16, np.float32)
    for pi in range(pages):
        if ok[pi]:
            kb = min(S, nk - pi * S)
            base = bases[pi]
            if few:
                for j0 in range(0, kb, 16):
                    _lm_scores_few(qp, lane_at, 16, kf, base + j0 * ld, ld, min(16, kb - j0), E, sc, 0, 16, FEW)
                    for j in range(min(16, kb - j0)):
                        for i in range(lanes):
                            st[(pi * S + j0 + j) * 16 + i] = sc[i * 16 + j]
            else:
                for j0 in range(0, kb, NR):
                    _lm_gemm_tile_rows(qp, 0, kf, base + j0 * ld, ld, 1, min(NR, kb - j0), E, st[(pi * S + j0) * 16:], 16)
    # softmax_scaled down each lane's column of keys 0 .. its position
    _lm_mask(st, nk, lanes, lpos, ok, S, np.float32(-np.inf))
    top = np.full(16, np.float32(-3.0000000054977558e+38), np.float32)
    _lm_max16(st, 0, nk, scale, top)
    _lm_exp16(st, 0, nk, scale, top)
    _lm_mask(st, nk, lanes, lpos, ok, S, np.float32(0.0))
    part = np.zeros(32 * 16, np.float32)   # part[c * 16 + i]: lane i's sum of keys n with n % 32 == c
    for b in range(nk // 32):
        for z in range(32 * 16):
            part[z] = part[z] + st[b * 512 + z]
    for n in range(nk // 32 * 32, nk):
        for i in range(16):
            part[(n % 32) * 16 + i] = part[(n % 32) * 16 + i] + st[n * 16 + i]
    for width in (16, 8, 4, 2, 1):
        for z in range(width * 16):
            part[z] = part[z] + part[z + width * 16]
    inv = np.zeros(16, np.float32)
    for i in range(16):
        total = np.float32(0.0) + part[i]
        if total > np.float32(0.0):   # 0 only for a lane that sees no key (every page missing)
            inv[i] = np.float32(1.0) / total
    _lm_mul16(st, 0, nk, inv)
    # the outputs: chain over keys of p_in * v_n[e], page by page
    if few:   # acc[i * E + e], features in the vector lanes
        acc = np.zeros(FEW * E, np.float32)
        for pi in range(pages):
            if ok[pi]:
                _lm_values_few(st, pi * S * 16, 1, 16, cache, bases[pi], ld, min(S, nk - pi * S), E, acc, FEW)
        for i in range(lanes):
            for e in range(E):
                o[tok[i], col[i] + e] = acc[i * E + e]
        return
    fblocks = (E + NR - 1) // NR   # acc[e * 16 + i]
    acc = np.zeros(fblocks * NR * 16, np.float32)
    for pi in range(pages):
        if ok[pi]:
            kb = min(S, nk - pi * S)
            for fb in range(fblocks):
                _lm_gemm_tile_rows(st, pi * S * 16, vf, vbases[pi] + fb * NR, 1, vld, min(NR, E - fb * NR), kb, acc[fb * NR * 16:], 16)
    for i in range(lanes):
        for e in range(E):
            o[tok[i], col[i] + e] = acc[e * 16 + i]


@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_tasks(rows, positions, R, slots, L, layer, hpg, o):
    # each row's tokens in packed order (order[start[r]:start[r + 1]]), its blocks of 16
    # lanes (blocks[r]:blocks[r + 1]) and each block's row; a token with no row or position
    # gets zeros. Serial, outside the parallel driver: there numba would make every np.zeros
    # a parallel loop of its own, each a launch of the thread pool (2 us of a decode call)
    T, QD = o.shape
    count = np.zeros(R, np.int64)
    valid = np.zeros(T, np.bool_)
    for t in range(T):
        r = rows[t]
        valid[t] = r >= 0 and r < R and positions[t] >= 0 and positions[t] < slots and layer >= 0 and layer < L
        if valid[t]:
            count[r] += 1
        else:
            for c in range(QD):
                o[t, c] = np.float32(0.0)
    start = np.zeros(R + 1, np.int64)
    blocks = np.zeros(R + 1, np.int64)
    for r in range(R):
        start[r + 1] = start[r] + count[r]
        blocks[r + 1] = blocks[r] + (count[r] * hpg + 15) // 16
    order = np.empty(start[R], np.int64)
    fill = start.copy()
    for t in range(T):
        if valid[t]:
            r = rows[t]
            order[fill[r]] = t
            fill[r] += 1
    block_row = np.empty(blocks[R], np.int64)
    for r in range(R):
        for b in range(blocks[r], blocks[r + 1]):
            block_row[b] = r
    return count, start, blocks, order, block_row


@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")
def k_attention_paged(q, rows, positions, page_table, k_cache, v_cache, layer, heads, kv_heads, scale, o):
    R = page_table.shape[0]
    N, L, S, KD = k_cache.shape
    E = q.shape[1] // heads
    hpg = heads // kv_heads
    scale = np.float32(scale)
    count, start, blocks, order, block_row = _lm_tasks(rows, positions, R, page_table.shape[1] * S, L, layer, hpg, o)
    kf = k_cache.reshape(-1)
    vf = v_cache.reshape(-1)
    tasks = blocks[R] * kv_heads
    for task in prange(tasks):
        b = task // kv_heads
        r = block_row[b]
        if task + 1 < tasks:   # most often this thread's next task (8 decode rows: 79-84 -> 77 us)
            _lm_ask_first_pages(kf, page_table, block_row[(task + 1) // kv_heads], (task + 1) % kv_heads, N, L, S, KD,
                                layer, E)
        _lm_attend(q, order[start[r]:start[r + 1]], (b - blocks[r]) * 16, count[r], hpg, r, positions, page_table,
                   kf, vf, N, L, S, KD, layer, task % kv_heads, E, scale, o)
'''


def function_name(motif: str = "attention_paged") -> str:
    """One driver serves both motifs (numba compiles it per cache dtype)."""
    return "k_attention_paged"


def render_module(motif: str = "attention_paged") -> str:
    """The generated numba module of the motif, written to the kernel cache like every kernel."""
    import numba

    from loomc.lower.numba_helpers import IMPORTS, helpers_for

    header = (f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.\n"
              f"# motif {motif}: causal grouped-query attention over the paged cache on the GEMM tile "
              f"(loomc/lower/paged_attention.py), tile {matmul.PANEL_ROWS} x {matmul.TILE_COLS}\n")
    constants = (f"MR = {matmul.PANEL_ROWS}\nNR = {matmul.TILE_COLS}\nUNROLL = {matmul.UNROLL}\nFEW = {FEW}\n"
                 f"PREFETCH_PAGES = {PREFETCH_PAGES}\n")
    helpers = "".join(h + "\n\n" for h in helpers_for(_DRIVER + SOFTMAX_ROW_SOURCE))
    return (header + IMPORTS + "\n" + constants + "\n" + helpers + matmul.TILE_SOURCE + SOFTMAX_VECTOR_SOURCE
            + SOFTMAX_ROW_SOURCE + IR_HELPERS_SOURCE + FEW_SOURCE + "\n" + _DRIVER)


def workspace_for(motif: str, dims: list[list[int]], scalars: list) -> int:
    """No shared workspace: each task allocates its own scores (64 bytes per key it reads)."""
    return 0


def launch_arguments(motif: str, values: list, workspace: np.ndarray) -> tuple:
    """The driver's arguments for a dispatch's operands, after the checks the motif's signature
    cannot make (they depend on its scalars); ValueError when one fails."""
    q, rows, positions, page_table, k_cache, v_cache, layer, heads, kv_heads, scale, o = values
    heads, kv_heads = int(heads), int(kv_heads)
    qd, kd = q.shape[1], k_cache.shape[3]
    if heads < 1 or kv_heads < 1 or qd % heads or heads % kv_heads:
        raise ValueError(f"{qd} query features are not {heads} heads in groups over {kv_heads} kv heads")
    if kd != kv_heads * (qd // heads):
        raise ValueError(f"the cache's {kd} features are not {kv_heads} kv heads of {qd // heads}")
    if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
        raise ValueError("the caches must be contiguous (they are read in place)")
    caches = []
    for cache, dtype in zip((k_cache, v_cache), MOTIFS[motif]):
        if dtype == "f16" and cache.dtype == np.float16:   # float16 host arrays reach the driver as their bits
            cache = cache.view(np.uint16)
        if cache.dtype != (np.uint16 if dtype == "f16" else np.float32):
            raise ValueError(f"{motif} reads {' and '.join(MOTIFS[motif])} caches, not {k_cache.dtype} and {v_cache.dtype}")
        caches.append(cache)
    k_cache, v_cache = caches
    return q, rows, positions, page_table, k_cache, v_cache, int(layer), heads, kv_heads, float(scale), o


def argument_examples(motif: str = "attention_paged") -> tuple:
    """One value of each argument's exact type as dispatch passes them, for compiling ahead."""
    i32 = np.zeros(1, np.int32)
    k_cache, v_cache = (np.zeros((1, 1, 1, 1), np.uint16 if dtype == "f16" else np.float32) for dtype in MOTIFS[motif])
    return (np.zeros((1, 1), np.float32), i32, i32, np.zeros((1, 1), np.int32), k_cache, v_cache, 0, 1, 1, 1.0,
            np.zeros((1, 1), np.float32))


def load_function(motif: str = "attention_paged", cache_dir: Path | None = None):
    """The compiled (lazily, then cached on disk) numba dispatcher: it takes the operands in
    the signature's order."""
    from loomc.lower.numba import ensure_module, load_module, module_path

    text = render_module(motif)
    path = module_path(text, cache_dir)
    ensure_module(path, text)
    return getattr(load_module(path), function_name(motif))

"""The int8 matmul motif on the cpu target: activations quantized per row to 8 bits, int8 weights.

    matmul_i8(a: f32[M, K], b: i8[NB, KQ, 64], scale: f32[1], out c: f32[M, N])

`b` is an int8 matrix w[N, K] with one scale and zero point 0 (the weights of ONNX dynamic
quantization) in panels of 16 rows, four k per 32-bit lane: b[nb, kq, 4 l + j] =
w[16 nb + l, 4 kq + j], zero past N and K, so NB = ceil(N / 16) and KQ = ceil(K / 4)
(`pack_i8_panels` in std:speech.loom makes it once, at preparation). Each row m of `a` is
quantized as ONNX's DynamicQuantizeLinear quantizes a whole tensor, but on its own:

    lo = min(0, min_k a[m, k]),  hi = max(0, max_k a[m, k]),  s = (hi - lo) / 255
    zp = clamp(rint(-lo / s), 0, 255),  q[k] = clamp(rint(a[m, k] / s) + zp, 0, 255)
    c[m, n] = f32(sum_k (q[k] - zp) * w[n, k]) * (s * scale)

all in f32, rint ties to even (s = 0, a row of zeros: c's row is 0; the range ignores a NaN,
whose code is 0, as DynamicQuantizeLinear defines nothing for one). The sum is exact integer
arithmetic, and its conversion and the one product are single roundings, so a row's output
depends on that row alone (batch invariance), on no thread split and no SIMD class: only the
instructions differ. onnxruntime quantizes over the whole tensor (every frame of a sentence),
which couples the rows; one row's range is never wider than its tensor's, so the per-row steps
are never coarser than onnxruntime's.

Why: onnxruntime runs these products as `MatMulInteger`, which VNNI computes at several times
the f32 rate. With AVX-512 VNNI, each step of k takes one 32-bit broadcast of four codes of a
row and one `vpdpbusd` per panel (u8 codes times s8 weights, four products summed into each
i32 lane), a tile of 6 rows by 4 panels (24 zmm accumulators) held in registers over all of k;
the weights' panels are read in place: 2.2-3.8x the f32 matmul motif on the speaker's products
(200 x 256 . 768 ... 40 x 192 . 384), 2 cores. Without VNNI the codes and weights are widened
to 16 bits and multiplied in pairs (`vpmaddwd`; `vpmaddubsw` would saturate), into
accumulators of pair sums summed to columns after the last k: about the f32 motif's speed on
AVX2 (1.00-1.18x) and AVX-512 without VNNI (0.92-1.11x), measured as those classes' code on
the VNNI machine. Without AVX2, plain vector IR (products widened to i32).

How it runs: a pass quantizes every row into the workspace (codes [M, 4 KQ], then zp and
s * scale per row; in parallel from PARALLEL_QUANTIZE elements of a, below that waking the
other threads costs more than the work) and sums each weight row's codes (sum_k w[n, k], for
the zero point: sum_k (q - zp) w = sum_k q w - zp sum_k w, exact); then parallel tasks over
(group of PANELS panels, block of ROWS rows), group outer, so a task's panels stay in cache
while the row blocks pass; each tile converts and stores its outputs itself (masked stores at
the last columns).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loomc import LOOMC_VERSION
from loomc.lower.attention import VECTOR_LOOP_SOURCE
from loomc.lower.qdot import IR_HELPERS_SOURCE

MOTIFS = {"matmul_i8": "i8"}
LANES = 16        # output columns per panel (one <16 x i32>)
QUAD = 4          # k per 32-bit lane
PANEL = LANES * QUAD   # bytes per step of k in a panel
PARALLEL_QUANTIZE = 1 << 15   # elements of a from which rows are quantized in parallel


def tile_shape() -> tuple[int, int]:
    """(rows of a, panels of b) per tile, whose accumulators must stay in vector registers.
    AVX-512 VNNI: 6 x 4 of one zmm (24 of 32). Without VNNI the tile multiplies pairs
    (`vpmaddwd` on the codes and weights widened to 16 bits) into accumulators of pair sums,
    twice as wide: AVX-512 6 x 2 of two zmm (24 of 32; 4 x 2 measured 0.86-1.14x the f32
    motif, 6 x 2 0.92-1.11x), AVX2 3 x 1 of four ymm (12 of 16, beside the weights' four;
    2 x 1 measured 0.91-1.15x, 3 x 1 1.00-1.18x)."""
    from loomc.lower.matmul import target_has

    if target_has("avx512vnni") and target_has("avx512f"):
        return 6, 4
    if target_has("avx512bw"):
        return 6, 2
    return (3, 1) if target_has("avx2") else (2, 2)


def panels_of(n: int, k: int) -> tuple[int, int]:
    """(NB, KQ): the packed shape's first two dimensions for w[n, k]."""
    return -(-n // LANES), -(-k // QUAD)


def workspace_elems(m: int, k: int, n: int) -> int:
    """f32 elements of the workspace: the codes (m rows of 4 KQ bytes), then per row its zero
    point and factor, then per packed column its code sum."""
    nb, kq = panels_of(n, k)
    return m * kq + 2 * m + nb * LANES


_DRIVER = '''
@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")
def FUNCTION(a, b, scale, c, ws):
    M, K = a.shape
    N = c.shape[1]
    NB, KQ = b.shape[0], b.shape[1]
    if NB != (N + LANES - 1) // LANES or KQ != (K + QUAD - 1) // QUAD or b.shape[2] != PANEL:
        raise ValueError("matmul_i8: b is not w[N, K] in panels: [ceil(N / 16), ceil(K / 4), 64]")
    if ws.size < M * KQ + 2 * M + NB * LANES:
        raise ValueError("matmul_i8: workspace smaller than workspace_elems")
    ldq = KQ * QUAD
    codes = ws[:M * KQ].view(np.uint8)
    zps = ws[M * KQ:M * KQ + M].view(np.int32)
    factors = ws[M * KQ + M:M * KQ + 2 * M]
    sums = ws[M * KQ + 2 * M:M * KQ + 2 * M + NB * LANES].view(np.int32)
    a_flat = a.reshape(-1)
    b_flat = b.reshape(-1)
    c_flat = c.reshape(-1)
    if M * K >= PARALLEL_QUANTIZE:
        for m in prange(M):
            _lm_i8_quantize(a_flat, m * K, K, codes, m * ldq, zps, factors, m, scale[0])
    else:   # a few microseconds of work: not worth waking the other threads for
        for m in range(M):
            _lm_i8_quantize(a_flat, m * K, K, codes, m * ldq, zps, factors, m, scale[0])
    for nb in range(NB):
        _lm_i8_sums(b_flat, nb * KQ * PANEL, KQ, sums, nb * LANES)
    groups = (NB + PANELS - 1) // PANELS
    blocks = (M + ROWS - 1) // ROWS
    for task in prange(groups * blocks):
        g = task // blocks
        r0 = (task % blocks) * ROWS
        nb0 = g * PANELS
        _lm_i8_tile(codes, r0 * ldq, ldq, min(ROWS, M - r0), b_flat, nb0 * KQ * PANEL, KQ * PANEL,
                    min(PANELS, NB - nb0), KQ, zps, factors, r0, sums, c_flat, r0 * N + nb0 * LANES, N,
                    min(PANELS * LANES, N - nb0 * LANES))
'''

# The passes and the tile as LLVM IR (16 lanes of f32 or i32 per vector; masked loads and
# stores at the ends of rows).
_INTRINSICS = IR_HELPERS_SOURCE + VECTOR_LOOP_SOURCE + '''

def _lm_tile_form():
    # how the tile multiplies: "vnni" (vpdpbusd on zmm), "pairs" with the width in 16-bit
    # lanes of one pmaddwd (32: AVX-512, 16: AVX2), or "plain" vector IR
    if _lm_target_has("avx512vnni") and _lm_target_has("avx512f"):
        return "vnni", 0
    if _lm_target_has("avx512bw"):
        return "pairs", 32
    if _lm_target_has("avx2"):
        return "pairs", 16
    return "plain", 0


def _lm_quad_dot(builder, acc, a4, w):
    # acc + (lane l: the sum over j < 4 of u8 byte 4 l + j of a4 times s8 byte 4 l + j of w),
    # exact: one vpdpbusd with AVX-512 VNNI, else plain vector IR (products widened to i32)
    from llvmlite import ir as llir

    i8, i32 = llir.IntType(8), llir.IntType(32)
    v16i, v64b, v64i = llir.VectorType(i32, 16), llir.VectorType(i8, 64), llir.VectorType(i32, 64)
    if _lm_tile_form()[0] == "vnni":
        dot = _lm_ir_function(builder, "llvm.x86.avx512.vpdpbusd.512", v16i, [v16i, v16i, v16i])
        return builder.call(dot, [acc, a4, w])
    products = builder.mul(builder.zext(builder.bitcast(a4, v64b), v64i), builder.sext(builder.bitcast(w, v64b), v64i))
    for j in range(4):
        part = builder.shuffle_vector(products, products, llir.Constant(v16i, [4 * l + j for l in range(16)]))
        acc = builder.add(acc, part)
    return acc


def _lm_lane_mask(builder, valid):
    # <16 x i1>: lane l < valid (an i64)
    from llvmlite import ir as llir

    lanes = llir.Constant(llir.VectorType(llir.IntType(64), 16), list(range(16)))
    return builder.icmp_signed("<", lanes, _lm_splat(builder, valid, 16))


def _lm_splat(builder, x, width):
    from llvmlite import ir as llir

    vec = llir.VectorType(x.type, width)
    zero = llir.Constant(llir.VectorType(llir.IntType(32), width), [0] * width)
    return builder.shuffle_vector(builder.insert_element(llir.Constant(vec, None), x, llir.Constant(llir.IntType(32), 0)),
                                  llir.Constant(vec, None), zero)


def _lm_i8_quantize_codegen(context, builder, sig, args):
    # (a, a_off, K, codes, q_off, zps, factors, m, w_scale): row a[a_off:a_off + K] to codes
    # [q_off:q_off + K], its zero point to zps[m] and s * w_scale to factors[m] (the module's
    # docstring; s = 0: codes 0, zero point 0, factor 0)
    from llvmlite import ir as llir

    f32, i8, i32, i64 = llir.FloatType(), llir.IntType(8), llir.IntType(32), llir.IntType(64)
    v16f, v16b, v16i = llir.VectorType(f32, 16), llir.VectorType(i8, 16), llir.VectorType(i32, 16)
    a, a_off, depth, codes, q_off, zps, factors, m = _lm_arguments(context, builder, sig, args)[:8]
    w_scale = context.cast(builder, args[8], sig.args[8], types.float32)
    xs = _lm_pointer(context, builder, sig.args[0], a, a_off, f32)
    qs = _lm_pointer(context, builder, sig.args[3], codes, q_off, i8)
    chunks = builder.sdiv(depth, llir.Constant(i64, 16))
    rest = builder.sub(depth, builder.mul(chunks, llir.Constant(i64, 16)))
    tail = _lm_lane_mask(builder, rest)
    zero_v = llir.Constant(v16f, [0.0] * 16)
    fmin = _lm_ir_function(builder, "llvm.minnum.v16f32", v16f, [v16f, v16f])
    fmax = _lm_ir_function(builder, "llvm.maxnum.v16f32", v16f, [v16f, v16f])
    rint = _lm_ir_function(builder, "llvm.rint.v16f32", v16f, [v16f])
    load_masked = _lm_ir_function(builder, "llvm.masked.load.v16f32.p0", v16f,
                                  [v16f.as_pointer(), i32, llir.VectorType(llir.IntType(1), 16), v16f])
    store_masked = _lm_ir_function(builder, "llvm.masked.store.v16i8.p0", llir.VoidType(),
                                   [v16b, v16b.as_pointer(), i32, llir.VectorType(llir.IntType(1), 16)])

    def chunk_at(base, i, element_vec):
        return builder.bitcast(builder.gep(base, [builder.mul(i, llir.Constant(i64, 16))]), element_vec.as_pointer())

    def range_body(i, values):
        v = builder.load(chunk_at(xs, i, v16f), align=4)
        return [builder.call(fmin, [values[0], v]), builder.call(fmax, [values[1], v])]

    lo_v, hi_v = _lm_vector_loop(builder, chunks, [zero_v, zero_v], range_body)
    v = builder.call(load_masked, [chunk_at(xs, chunks, v16f), llir.Constant(i32, 4), tail, zero_v])
    lo_v, hi_v = builder.call(fmin, [lo_v, v]), builder.call(fmax, [hi_v, v])
    lo = builder.call(_lm_ir_function(builder, "llvm.vector.reduce.fmin.v16f32", f32, [v16f]), [lo_v])
    hi = builder.call(_lm_ir_function(builder, "llvm.vector.reduce.fmax.v16f32", f32, [v16f]), [hi_v])
    s = builder.fdiv(builder.fsub(hi, lo), llir.Constant(f32, 255.0))
    empty = builder.fcmp_ordered("==", s, llir.Constant(f32, 0.0))
    rint1 = _lm_ir_function(builder, "llvm.rint.f32", f32, [f32])
    zp = builder.call(rint1, [builder.fdiv(builder.fsub(llir.Constant(f32, 0.0), lo), s)])
    zp = builder.select(builder.fcmp_ordered(">", zp, llir.Constant(f32, 255.0)), llir.Constant(f32, 255.0), zp)
    zp = builder.select(builder.fcmp_ordered(">", zp, llir.Constant(f32, 0.0)), zp, llir.Constant(f32, 0.0))
    zp = builder.select(empty, llir.Constant(f32, 0.0), zp)
    builder.store(builder.fptosi(zp, i32), _lm_pointer(context, builder, sig.args[5], zps, m, i32))
    factor = builder.select(empty, llir.Constant(f32, 0.0), builder.fmul(s, w_scale))
    builder.store(factor, _lm_pointer(context, builder, sig.args[6], factors, m, f32))
    s_v, zp_v = _lm_splat(builder, s, 16), _lm_splat(builder, zp, 16)
    top = llir.Constant(v16f, [255.0] * 16)

    def codes_of(v):   # clamp(rint(v / s) + zp, 0, 255) as bytes; s = 0 gives NaN or inf: 0 unless inf
        q = builder.fadd(builder.call(rint, [builder.fdiv(v, s_v)]), zp_v)
        q = builder.call(fmin, [builder.call(fmax, [q, zero_v]), top])
        q = builder.select(_lm_splat(builder, empty, 16), zero_v, q)
        return builder.trunc(builder.fptosi(q, v16i), v16b)

    def codes_body(i, values):
        builder.store(codes_of(builder.load(chunk_at(xs, i, v16f), align=4)), chunk_at(qs, i, v16b), align=1)
        return values

    _lm_vector_loop(builder, chunks, [], codes_body)
    v = builder.call(load_masked, [chunk_at(xs, chunks, v16f), llir.Constant(i32, 4), tail, zero_v])
    builder.call(store_masked, [codes_of(v), chunk_at(qs, chunks, v16b), llir.Constant(i32, 1), tail])
    return context.get_dummy_value()


@intrinsic
def _lm_i8_quantize(typingctx, a, a_off, depth, codes, q_off, zps, factors, m, w_scale):
    return types.none(a, a_off, depth, codes, q_off, zps, factors, m, w_scale), _lm_i8_quantize_codegen


def _lm_i8_sums_codegen(context, builder, sig, args):
    # (b, b_off, steps, sums, s_off): sums[s_off + l] = sum over the panel's k of its column l
    from llvmlite import ir as llir

    i8, i32, i64 = llir.IntType(8), llir.IntType(32), llir.IntType(64)
    v16i = llir.VectorType(i32, 16)
    b, b_off, steps, sums, s_off = _lm_arguments(context, builder, sig, args)
    bs = _lm_pointer(context, builder, sig.args[0], b, b_off, i8)
    ones = llir.Constant(v16i, [0x01010101] * 16)

    def body(k, values):
        w = builder.load(builder.bitcast(builder.gep(bs, [builder.mul(k, llir.Constant(i64, 64))]), v16i.as_pointer()), align=1)
        return [_lm_quad_dot(builder, values[0], ones, w)]

    total, = _lm_vector_loop(builder, steps, [llir.Constant(v16i, [0] * 16)], body)
    builder.store(total, _lm_pointer(context, builder, sig.args[3], sums, s_off, v16i), align=4)
    return context.get_dummy_value()


@intrinsic
def _lm_i8_sums(typingctx, b, b_off, steps, sums, s_off):
    return types.none(b, b_off, steps, sums, s_off), _lm_i8_sums_codegen


def _lm_i8_tile_codegen(context, builder, sig, args):
    # (codes, q_off, ldq, rows, b, b_off, ldp, panels, steps, zps, factors, r0, sums, c, c_off,
    # ldc, width): the integer dots of code rows i < ROWS (from q_off, ldq apart; rows past
    # `rows` read row 0, not stored) with columns of panels v < PANELS (from b_off, ldp apart;
    # panels past `panels` read panel 0) over `steps` quads of k, in registers; then
    # c[c_off + i * ldc + u] = f32(dot - zps[r0 + i] * sums[u]) * factors[r0 + i] for u < width
    from llvmlite import ir as llir

    f32, i8, i32, i64 = llir.FloatType(), llir.IntType(8), llir.IntType(32), llir.IntType(64)
    v16f, v16i = llir.VectorType(f32, 16), llir.VectorType(i32, 16)
    (codes, q_off, ldq, rows, b, b_off, ldp, panels, steps, zps, factors, r0, sums, c, c_off, ldc,
     width) = _lm_arguments(context, builder, sig, args)
    qs = _lm_pointer(context, builder, sig.args[0], codes, q_off, i8)
    bs = _lm_pointer(context, builder, sig.args[4], b, b_off, i8)
    zero = llir.Constant(i64, 0)
    row_at = [builder.select(builder.icmp_signed("<", llir.Constant(i64, i), rows),
                             builder.mul(ldq, llir.Constant(i64, i)), zero) for i in range(ROWS)]
    panel_at = [builder.select(builder.icmp_signed("<", llir.Constant(i64, v), panels),
                               builder.mul(ldp, llir.Constant(i64, v)), zero) for v in range(PANELS)]
    splat = llir.Constant(v16i, [0] * 16)
    form, span = _lm_tile_form()

    def quad_at(i, k):   # row i's four codes at step k, as one i32
        at = builder.gep(qs, [builder.add(row_at[i], builder.mul(k, llir.Constant(i64, 4)))])
        return builder.load(builder.bitcast(at, i32.as_pointer()), align=1)

    def weights_at(v, k, offset, vtype):   # `vtype` from byte `offset` of panel v's step k
        at = builder.gep(bs, [builder.add(panel_at[v], builder.add(builder.mul(k, llir.Constant(i64, 64)),
                                                                     llir.Constant(i64, offset)))])
        return builder.load(builder.bitcast(at, vtype.as_pointer()), align=1)

    if form == "pairs":
        # per accumulator 64 / span vectors of span / 2 pair sums: lane 2c + p of vector u is
        # column u * span / 4 + c, codes 2p and 2p + 1 of its quad (summed to columns at the end)
        i16 = llir.IntType(16)
        chunks = 64 // span
        vb, vs, vi = llir.VectorType(i8, span), llir.VectorType(i16, span), llir.VectorType(i32, span // 2)
        madd = _lm_ir_function(builder, "llvm.x86.avx512.pmaddw.d.512" if span == 32 else "llvm.x86.avx2.pmadd.wd",
                               vi, [vs, vs])
        quads = llir.VectorType(i32, span // 4)

        def body(k, accs):
            w = [[builder.sext(weights_at(v, k, u * span, vb), vs) for u in range(chunks)] for v in range(PANELS)]
            out_accs = []
            for i in range(ROWS):
                q = quad_at(i, k)
                a = builder.shuffle_vector(builder.insert_element(llir.Constant(quads, None), q, llir.Constant(i32, 0)),
                                           llir.Constant(quads, None), llir.Constant(quads, [0] * (span // 4)))
                a = builder.zext(builder.bitcast(a, vb), vs)
                for v in range(PANELS):
                    base = (i * PANELS + v) * chunks
                    out_accs += [builder.add(accs[base + u], builder.call(madd, [a, w[v][u]])) for u in range(chunks)]
            return out_accs

        pair_sums = _lm_vector_loop(builder, steps, [llir.Constant(vi, [0] * (span // 2))] * (ROWS * PANELS * chunks), body)
        accs = []
        for t in range(ROWS * PANELS):
            parts = pair_sums[t * chunks:(t + 1) * chunks]
            while len(parts) > 1:   # join into one <32 x i32>
                n = parts[0].type.count
                parts = [builder.shuffle_vector(parts[j], parts[j + 1], llir.Constant(llir.VectorType(i32, 2 * n), list(range(2 * n))))
                         for j in range(0, len(parts), 2)]
            whole = parts[0]
            even = builder.shuffle_vector(whole, whole, llir.Constant(v16i, [2 * c for c in range(16)]))
            odd = builder.shuffle_vector(whole, whole, llir.Constant(v16i, [2 * c + 1 for c in range(16)]))
            accs.append(builder.add(even, odd))
    else:
        def body(k, accs):
            w = [weights_at(v, k, 0, v16i) for v in range(PANELS)]
            out_accs = []
            for i in range(ROWS):
                a4 = builder.shuffle_vector(builder.insert_element(llir.Constant(v16i, None), quad_at(i, k), llir.Constant(i32, 0)),
                                            llir.Constant(v16i, None), splat)
                for v in range(PANELS):
                    out_accs.append(_lm_quad_dot(builder, accs[i * PANELS + v], a4, w[v]))
            return out_accs

        accs = _lm_vector_loop(builder, steps, [llir.Constant(v16i, [0] * 16)] * (ROWS * PANELS), body)
    store_masked = _lm_ir_function(builder, "llvm.masked.store.v16f32.p0", llir.VoidType(),
                                   [v16f, v16f.as_pointer(), i32, llir.VectorType(llir.IntType(1), 16)])
    sums_p = _lm_pointer(context, builder, sig.args[12], sums, llir.Constant(i64, 0), i32)
    c_p = _lm_pointer(context, builder, sig.args[13], c, c_off, f32)
    masks = [_lm_lane_mask(builder, builder.sub(width, llir.Constant(i64, 16 * v))) for v in range(PANELS)]
    column_sums = []
    for v in range(PANELS):   # the panel's code sums, from the group's first column (c_off's column)
        first = builder.add(builder.srem(c_off, ldc), llir.Constant(i64, 16 * v))
        first = builder.select(builder.icmp_signed("<", llir.Constant(i64, v), panels), first, zero)
        column_sums.append(builder.load(builder.bitcast(builder.gep(sums_p, [first]), v16i.as_pointer()), align=4))
    for i in range(ROWS):
        with builder.if_then(builder.icmp_signed("<", llir.Constant(i64, i), rows)):
            m = builder.add(r0, llir.Constant(i64, i))
            zp = _lm_splat(builder, builder.load(_lm_pointer(context, builder, sig.args[9], zps, m, i32)), 16)
            f = _lm_splat(builder, builder.load(_lm_pointer(context, builder, sig.args[10], factors, m, f32)), 16)
            row = builder.gep(c_p, [builder.mul(ldc, llir.Constant(i64, i))])
            for v in range(PANELS):
                total = builder.sub(accs[i * PANELS + v], builder.mul(zp, column_sums[v]))
                value = builder.fmul(builder.sitofp(total, v16f), f)
                at = builder.bitcast(builder.gep(row, [llir.Constant(i64, 16 * v)]), v16f.as_pointer())
                builder.call(store_masked, [value, at, llir.Constant(i32, 4), masks[v]])
    return context.get_dummy_value()


@intrinsic
def _lm_i8_tile(typingctx, codes, q_off, ldq, rows, b, b_off, ldp, panels, steps, zps, factors, r0, sums, c, c_off,
                ldc, width):
    return (types.none(codes, q_off, ldq, rows, b, b_off, ldp, panels, steps, zps, factors, r0, sums, c, c_off, ldc,
                       width), _lm_i8_tile_codegen)
'''


def function_name(motif: str) -> str:
    return f"k_{motif}"


def render_module(motif: str = "matmul_i8") -> str:
    """The generated numba module, written to the kernel cache like every kernel."""
    import numba

    from loomc.lower.numba_helpers import IMPORTS

    header = (f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.\n"
              f"# motif {motif}: c = a . w^T, a quantized per row to 8 bits, int8 w in panels (loomc/lower/i8gemm.py)\n")
    rows, panels = tile_shape()
    constants = (f"LANES = {LANES}\nQUAD = {QUAD}\nPANEL = {PANEL}\nROWS = {rows}\nPANELS = {panels}\n"
                 f"PARALLEL_QUANTIZE = {PARALLEL_QUANTIZE}\n")
    return header + IMPORTS + "\n" + constants + _INTRINSICS + "\n" + _DRIVER.replace("FUNCTION", function_name(motif))


def workspace_for(motif: str, dims: list[list[int]], scalars: list) -> int:
    """`workspace_elems` from the operands' dimensions (a, b, scale, c), as a command dispatches them."""
    (m, k), _, _, (_, n) = dims
    return workspace_elems(m, k, n)


def launch_arguments(motif: str, values: list, workspace: np.ndarray) -> tuple:
    """The driver's arguments (a, b, scale, c, workspace); ValueError when b is not c's columns
    packed for a's depth or an operand is not contiguous (the tile reads them by address)."""
    a, b, scale, c = values
    m, k = a.shape
    n = c.shape[1] if c.ndim == 2 else -1
    if c.shape != (m, n) or b.shape != panels_of(n, k) + (PANEL,) or scale.shape != (1,):
        raise ValueError(f"a {a.shape}, b {b.shape}, scale {scale.shape}, c {c.shape} do not make c = a . w^T "
                         f"with w[N, K] packed as [ceil(N / 16), ceil(K / 4), 64]")
    if not (a.flags.c_contiguous and b.flags.c_contiguous and c.flags.c_contiguous):
        raise ValueError("a, b and c must be contiguous")
    if workspace.size < workspace_elems(m, k, n):
        raise ValueError(f"a workspace of {workspace.size} floats; this call needs {workspace_elems(m, k, n)}")
    return a, b, scale, c, workspace


def argument_examples(motif: str = "matmul_i8") -> tuple:
    """One value of each argument's exact type as dispatch passes them, for compiling ahead."""
    return (np.zeros((1, QUAD), np.float32), np.zeros((1, 1, PANEL), np.int8), np.ones(1, np.float32),
            np.zeros((1, LANES), np.float32), np.zeros(workspace_elems(1, QUAD, LANES), np.float32))


def load_function(motif: str = "matmul_i8", cache_dir: Path | None = None):
    """The compiled (lazily, then cached on disk) numba dispatcher: it takes (a, b, scale, c, workspace)."""
    from loomc.lower.numba import ensure_module, load_module, module_path

    text = render_module(motif)
    path = module_path(text, cache_dir)
    ensure_module(path, text)
    return getattr(load_module(path), function_name(motif))

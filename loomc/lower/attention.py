"""The attention motif on the cpu target: heads, scores, softmax and values in one call, no scores written.

    attention(qkv: f32[T, C], heads: i64, tokens: i64, scale: f32, out y: f32[T, D])

qkv holds fused projections as std:seq2seq.loom's `split_heads` reads them: row b * S + s is
token s of sequence b (S = tokens), its q, k and v side by side (C = 3 D), head h's E = D /
heads features at h * E of each part. y is, bit for bit, what `split_heads(qkv, heads, q, k,
vt)`, `bmm(q, k, s)`, `softmax_scaled(s, scale)`, `bmm(s, vt, o)` and `merge_heads(o, heads,
y)` compute: every score the matmul motif's one fma chain over e from +0.0, the softmax of
`s * scale` with softmax_scaled's own operations in its order (the maximum, Cephes'
polynomial exp clamped at -87, the 32-lane sum and its fixed pairwise fold, one reciprocal),
then every output element one fma chain over keys from +0.0. Only where things live changes:
the unfused calls copied q, k and v out per head and the output back, and wrote B x heads x S x
S scores (the recognizer's encoder, 12 x 1500 x 1500: 108 MB per layer), which the softmax read
and wrote again and the second `bmm` read once more; here a task's 16 rows of scores (16 S
floats) stay in its core's L2 from the first product to the last.

How it runs: the matmul motif's swapped tile (`loomc/lower/matmul.py`), the wide one where
there is one (`matmul.attention_tile`: MR x NR = 32 x 8 on AVX-512, else 16 x 16). Each
(sequence, head) has its keys packed into MR-key panels and its values into MR-feature panels,
once per call, the vector sides; a task takes (sequence, head, 16 queries: QB blocks of NR),
runs each panel of keys over every block of queries while it is in L1 (the queries read in
place from qkv as the broadcast side, the last partial block from a zero-padded copy), storing
16 rows of scores side by side, softmaxes each row in place and runs the output tiles with
those rows as the broadcast side, in slices of keys that stay in L1. (One block of 8 queries
per task on the wide tile read each panel of keys from L2 once per 8 queries: 1500 keys ran
0.76x the narrow tile; with 16 queries the wide tile is 1.07x at 257 and 1500 keys.)
Checked at dispatch, with the shapes: C = 3 D, D a multiple of heads, T a multiple of tokens,
E <= MAX_HEAD_DIM.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loomc import LOOMC_VERSION
from loomc.lower import matmul

MOTIFS = {"attention"}
MAX_HEAD_DIM = 256   # features per head: a task's output accumulators (QUERIES rows of them) live on its stack
QUERIES = 16   # queries per task: each panel of keys and of values is reused by this many rows while in L1


def workspace_elems(sequences: int, tokens: int, heads: int, head_dim: int) -> int:
    """f32 elements of the workspace one call wants: per (sequence, head), the keys packed in
    panels of MR keys and the values in panels of MR features; then a zero-padded copy of the
    last partial block of NR queries of each (sequence, head) (`matmul.attention_tile`)."""
    mr, nr, _ = matmul.attention_tile()
    groups = sequences * heads
    packed_k = groups * -(-tokens // mr) * head_dim * mr
    packed_v = groups * -(-head_dim // mr) * tokens * mr
    return packed_k + packed_v + (groups * nr * head_dim if tokens % nr else 0)


_DRIVER = '''
@njit(cache=True)
def _lm_pack_keys(qkv, first, col, S, E, p, ws, base):
    # ws[base + e * MR + i] = qkv[first + p * MR + i, col + e] (zeros past S): a panel of 16 keys
    for e in range(E):
        for i in range(MR):
            n = p * MR + i
            ws[np.uint64(base + e * MR + i)] = qkv[first + n, col + e] if n < S else np.float32(0.0)


@njit(cache=True)
def _lm_pack_values(qkv, first, col, S, E, p, ws, base):
    # ws[base + n * MR + i] = qkv[first + n, col + p * MR + i] (zeros past E): a panel of 16 features
    full = min(MR, E - p * MR)
    for n in range(S):
        for i in range(MR):
            ws[np.uint64(base + n * MR + i)] = qkv[first + n, col + p * MR + i] if i < full else np.float32(0.0)


@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")
def k_attention(qkv, y, heads, S, scale, ws):
    # y[b * S + m, h * E + e] = (softmax_scaled(q . k^T, scale) . v)[m, e] of sequence b, head h
    T, C = qkv.shape
    D = y.shape[1]
    E = D // heads
    B = T // S
    G = B * heads
    scale = np.float32(scale)
    kpan = (S + MR - 1) // MR
    vpan = (E + MR - 1) // MR
    qblocks = (S + NR - 1) // NR
    packed_k = G * kpan * E * MR
    packed_v = G * vpan * S * MR
    if ws.size < packed_k + packed_v + (G * NR * E if S % NR else 0):
        raise ValueError("attention: workspace smaller than workspace_elems")
    for gp in prange(G * kpan):
        g = gp // kpan
        _lm_pack_keys(qkv, (g // heads) * S, D + (g % heads) * E, S, E, gp % kpan, ws, gp * E * MR)
    for gp in prange(G * vpan):
        g = gp // vpan
        _lm_pack_values(qkv, (g // heads) * S, 2 * D + (g % heads) * E, S, E, gp % vpan, ws, packed_k + gp * S * MR)
    if S % NR:
        m0 = (qblocks - 1) * NR
        for g in range(G):
            pad = packed_k + packed_v + g * NR * E
            for j in range(NR):
                for e in range(E):
                    ws[pad + j * E + e] = qkv[(g // heads) * S + m0 + j, (g % heads) * E + e] if m0 + j < S else np.float32(0.0)
    qkv_flat = qkv.reshape(-1)
    y_flat = y.reshape(-1)
    kc = min(S, KC)
    slices = (S + kc - 1) // max(kc, 1)
    qgroups = (qblocks + QB - 1) // QB
    NP = kpan * MR
    for task in prange(G * qgroups):
        g = task // qgroups
        q0 = (task - g * qgroups) * QB
        nq = min(QB, qblocks - q0)
        first = (g // heads) * S
        h = g % heads
        # the scores of the task's queries (QB blocks of NR), s[(q * NR + j) * NP + n] = q[m] . k[n]
        # (rows padded to whole panels; rows past S score zero-padded queries): each panel of keys
        # runs over every block while it is in L1, each tile storing its block in place
        s = np.empty(QB * NR * NP, np.float32)   # every element the softmax or the values read is stored first
        for p in range(kpan):
            for q in range(nq):
                m0 = (q0 + q) * NR
                if m0 + NR <= S:
                    _lm_gemm_tile_fresh(ws, (g * kpan + p) * E * MR, qkv_flat, (first + m0) * C + h * E, C, E,
                                        s[q * NR * NP + p * MR:], NP, True)
                else:
                    _lm_gemm_tile_fresh(ws, (g * kpan + p) * E * MR, ws, packed_k + packed_v + g * NR * E, E, E,
                                        s[q * NR * NP + p * MR:], NP, True)
        # each row softmaxed in place with softmax_scaled's operations
        for q in range(nq):
            for j in range(min(NR, S - (q0 + q) * NR)):
                _lm_softmax_row(s, (q * NR + j) * NP, S, scale, 0)
        # the output rows: one fma chain over keys per element, in slices shared by the value panels
        acc = carray(_lm_alloca(ACC_ELEMS, np.float32), (ACC_ELEMS,))   # the first slice starts each chain from +0.0
        for t in range(slices):
            k0 = t * kc
            kn = min(kc, S - k0)
            for p in range(vpan):
                for q in range(nq):
                    _lm_gemm_tile_fresh(ws, packed_k + ((g * vpan + p) * S + k0) * MR, s, q * NR * NP + k0, NP, kn,
                                        acc[(q * vpan + p) * NR * MR:], MR, t == 0)
        for q in range(nq):
            m0 = (q0 + q) * NR
            for p in range(vpan):
                if m0 + NR <= S and (p + 1) * MR <= E:
                    _lm_store_tile(acc, (q * vpan + p) * NR * MR, y_flat, (first + m0) * D + h * E + p * MR, D)
                    continue
                for j in range(min(NR, S - m0)):
                    for i in range(min(MR, E - p * MR)):
                        y_flat[np.uint64((first + m0 + j) * D + h * E + p * MR + i)] = acc[np.uint64(((q * vpan + p) * NR + j) * MR + i)]
'''


# A counted loop in LLVM IR, for intrinsics that emit vector code (also loomc/lower/qdot.py's).
VECTOR_LOOP_SOURCE = '''
def _lm_vector_loop(builder, count, inits, body):
    # for i in 0..count: values = body(i, values); the values' final state (inits when count is 0)
    from llvmlite import ir as llir

    i64 = llir.IntType(64)
    entry = builder.block
    loop = builder.append_basic_block("vec.body")
    done = builder.append_basic_block("vec.done")
    builder.cbranch(builder.icmp_signed(">", count, llir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(i64)
    phis = [builder.phi(v.type) for v in inits]
    i.add_incoming(llir.Constant(i64, 0), entry)
    for phi, v in zip(phis, inits):
        phi.add_incoming(v, entry)
    values = body(i, phis)
    latch = builder.block   # the body's last block (not `loop` when the body has loops of its own)
    nxt = builder.add(i, llir.Constant(i64, 1))
    i.add_incoming(nxt, latch)
    for phi, v in zip(phis, values):
        phi.add_incoming(v, latch)
    builder.cbranch(builder.icmp_signed("<", nxt, count), loop, done)
    builder.position_at_end(done)
    outs = []
    for phi, v0, v in zip(phis, inits, values):
        out = builder.phi(v0.type)
        out.add_incoming(v0, entry)
        out.add_incoming(v, latch)
        outs.append(out)
    return outs
'''

# softmax_scaled's passes over whole vectors of 16, as LLVM IR (numba's LLVM picks 8-wide
# vectors for the plain loops on AVX-512 machines and leaves the max pass scalar). Each applies
# the same operations to each element as the scalar loop after it, so the bits are the same.
SOFTMAX_VECTOR_SOURCE = VECTOR_LOOP_SOURCE + '''

def _lm_vec_codegen(kind):
    def codegen(context, builder, sig, args):
        from llvmlite import ir as llir

        f32, i32, i64 = llir.FloatType(), llir.IntType(32), llir.IntType(64)
        vec = llir.VectorType(f32, 16)
        ivec = llir.VectorType(i32, 16)
        # (s, off, count, ...): max and exp take (scale, part/top), sum its lanes, mul its factor
        s_v, off_v, count_v = args[:3]
        a_v, b_v = (args[3], args[4]) if kind in ("max", "exp") else (args[3], args[3])
        base = builder.gep(context.make_array(sig.args[0])(context, builder, s_v).data, [off_v])

        def at(i, width):   # pointer to the vector of 16 at base + i * width (+ 16 for the second of two)
            return builder.bitcast(builder.gep(base, [builder.mul(i, llir.Constant(i64, width))]), vec.as_pointer())

        def splat(x):
            return builder.shuffle_vector(builder.insert_element(llir.Constant(vec, None), x, llir.Constant(i32, 0)),
                                          llir.Constant(vec, None), llir.Constant(ivec, [0] * 16))

        def const(x):
            return llir.Constant(vec, [x] * 16)

        def intrinsic(name):
            return cgutils.get_or_insert_function(builder.module, llir.FunctionType(vec, [vec] * (3 if name == "fma" else 1)),
                                                  "llvm.%s.v16f32" % name)

        def later(a, b):   # _lm_max(a, b): b if b > a else a
            return builder.select(builder.fcmp_ordered(">", b, a), b, a)

        if kind == "max":   # b[0:16] = lane maxima of s * a, from b's values
            part = builder.bitcast(context.make_array(sig.args[4])(context, builder, b_v).data, vec.as_pointer())
            (top,) = _lm_vector_loop(builder, count_v, [builder.load(part, align=4)],
                                     lambda i, v: [later(v[0], builder.fmul(builder.load(at(i, 16), align=4), splat(a_v)))])
            builder.store(top, part, align=4)
        elif kind == "exp":   # s = softmax_scaled's exp(max(s * a - b, -87)); b a scalar, or 16 (one per lane)
            fma, floor = intrinsic("fma"), intrinsic("floor")
            if isinstance(sig.args[4], types.Array):
                top = builder.load(builder.bitcast(context.make_array(sig.args[4])(context, builder, b_v).data,
                                                   vec.as_pointer()), align=4)
            else:
                top = splat(b_v)

            def body(i, v):
                p = at(i, 16)
                x = later(builder.fsub(builder.fmul(builder.load(p, align=4), splat(a_v)), top), const(-87.0))
                kk = builder.call(floor, [builder.fadd(builder.fmul(x, const(1.4426950216293335)), const(0.5))])
                r = builder.call(fma, [kk, const(-0.693359375), x])
                r = builder.call(fma, [kk, const(0.00021219444170128554), r])
                e = builder.call(fma, [const(0.00019875691214110702), r, const(0.001398199936375022)])
                for c in (0.008333452045917511, 0.04166579619050026, 0.1666666567325592, 0.5):
                    e = builder.call(fma, [e, r, const(c)])
                bits = builder.shl(builder.add(builder.fptosi(kk, ivec), llir.Constant(ivec, [127] * 16)),
                                   llir.Constant(ivec, [23] * 16))
                y = builder.fmul(builder.fadd(builder.call(fma, [e, builder.fmul(r, r), r]), const(1.0)),
                                 builder.bitcast(bits, vec))
                builder.store(y, p, align=4)
                return v

            _lm_vector_loop(builder, count_v, [llir.Constant(i64, 0)], body)
        elif kind == "sum":   # b[0:32] += s, 32 elements per step
            lanes = context.make_array(sig.args[3])(context, builder, b_v).data
            lo_p = builder.bitcast(lanes, vec.as_pointer())
            hi_p = builder.bitcast(builder.gep(lanes, [llir.Constant(i64, 16)]), vec.as_pointer())

            def body(i, v):
                first = at(i, 32)
                second = builder.bitcast(builder.gep(builder.bitcast(first, f32.as_pointer()), [llir.Constant(i64, 16)]),
                                         vec.as_pointer())
                return [builder.fadd(v[0], builder.load(first, align=4)), builder.fadd(v[1], builder.load(second, align=4))]

            lo, hi = _lm_vector_loop(builder, count_v, [builder.load(lo_p, align=4), builder.load(hi_p, align=4)], body)
            builder.store(lo, lo_p, align=4)
            builder.store(hi, hi_p, align=4)
        else:   # "mul": s = s * a; a a scalar, or 16 (one per lane)
            if isinstance(sig.args[3], types.Array):
                factor = builder.load(builder.bitcast(context.make_array(sig.args[3])(context, builder, a_v).data,
                                                      vec.as_pointer()), align=4)
            else:
                factor = splat(a_v)

            def body(i, v):
                p = at(i, 16)
                builder.store(builder.fmul(builder.load(p, align=4), factor), p, align=4)
                return v

            _lm_vector_loop(builder, count_v, [llir.Constant(i64, 0)], body)
        return context.get_dummy_value()

    return codegen


@intrinsic
def _lm_max16(typingctx, s, off, count, scale, part):
    return types.none(s, off, count, scale, part), _lm_vec_codegen("max")


@intrinsic
def _lm_exp16(typingctx, s, off, count, scale, top):
    return types.none(s, off, count, scale, top), _lm_vec_codegen("exp")


@intrinsic
def _lm_sum32(typingctx, s, off, count, lanes):
    return types.none(s, off, count, lanes), _lm_vec_codegen("sum")


@intrinsic
def _lm_mul16(typingctx, s, off, count, factor):
    return types.none(s, off, count, factor), _lm_vec_codegen("mul")
'''

SOFTMAX_ROW_SOURCE = '''
@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_softmax_row(s, row, N, scale, spare):
    # s[row + n] = softmax_scaled's value of s[row + n] * scale over n < N, its operations in its
    # order: whole vectors of 16 (32 for the sum) as LLVM IR, the rest as softmax_scaled's loops
    # (unsigned indices, as in generated kernels: no negative-index wrap to check). A row with
    # `spare` elements after it that it may overwrite (15 or more) runs exp and the multiply in
    # whole vectors only, the same operations on each element
    part = carray(_lm_alloca(16, np.float32), (16,))
    for z in range(16):
        part[z] = np.float32(-3.0000000054977558e+38)
    _lm_max16(s, row, N // 16, scale, part)
    top = np.float32(-3.0000000054977558e+38)
    for n in range(N // 16 * 16, N):
        top = _lm_max(top, s[np.uint64(row + n)] * scale)
    for z in range(16):
        top = _lm_max(top, part[z])
    whole = (N + min(spare, 15)) // 16
    _lm_exp16(s, row, whole, scale, top)
    for n in range(whole * 16, N):
        x = _lm_max(s[np.uint64(row + n)] * scale - top, np.float32(-87.0))
        kk = np.floor(x * np.float32(1.4426950216293335) + np.float32(0.5))
        r = _lm_fma(kk, np.float32(-0.693359375), x)
        r = _lm_fma(kk, np.float32(0.00021219444170128554), r)
        e = np.float32(0.00019875691214110702)
        e = _lm_fma(e, r, np.float32(0.001398199936375022))
        e = _lm_fma(e, r, np.float32(0.008333452045917511))
        e = _lm_fma(e, r, np.float32(0.04166579619050026))
        e = _lm_fma(e, r, np.float32(0.1666666567325592))
        e = _lm_fma(e, r, np.float32(0.5))
        s[np.uint64(row + n)] = (_lm_fma(e, r * r, r) + np.float32(1.0)) * np.int32(np.int32((np.int32((np.int32(kk) + np.int32(127))) << np.int32(23)))).view(np.float32)
    lanes = carray(_lm_alloca(32, np.float32), (32,))
    for z in range(32):
        lanes[z] = np.float32(0)
    _lm_sum32(s, row, N // 32, lanes)
    n0 = N // 32 * 32
    for l in range(min(16, N - n0)):
        lanes[l] = lanes[l] + s[np.uint64(row + n0 + l)]
    for l in range(min(16, N - n0 - 16)):
        lanes[16 + l] = lanes[16 + l] + s[np.uint64(row + n0 + 16 + l)]
    _lm_fold(lanes, 16)
    _lm_fold(lanes, 8)
    _lm_fold(lanes, 4)
    _lm_fold(lanes, 2)
    _lm_fold(lanes, 1)
    total = np.float32(0.0) + lanes[0]
    inv = np.float32(1.0) / total
    _lm_mul16(s, row, whole, inv)
    for n in range(whole * 16, N):
        s[np.uint64(row + n)] = s[np.uint64(row + n)] * inv
'''


def function_name(motif: str = "attention") -> str:
    return f"k_{motif}"


def render_module(motif: str = "attention") -> str:
    """The generated numba module of the motif, written to the kernel cache like every kernel."""
    import numba

    from loomc.lower.numba_helpers import IMPORTS, helpers_for

    mr, nr, kc = matmul.attention_tile()
    header = (f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.\n"
              f"# motif {motif}: y = merge_heads(bmm(softmax_scaled(bmm(q, k), scale), vt)) of split_heads(qkv), without the scores "
              f"(loomc/lower/attention.py), tile {mr} x {nr}\n")
    blocks = max(1, QUERIES // nr)
    constants = f"MR = {mr}\nNR = {nr}\nUNROLL = {matmul.UNROLL}\nKC = {kc}\nQB = {blocks}\n"
    acc = blocks * -(-MAX_HEAD_DIM // mr) * nr * mr
    driver = _DRIVER.replace("ACC_ELEMS", str(acc)).replace("NR * MR", str(mr * nr))
    helpers = "".join(h + "\n\n" for h in helpers_for(driver + SOFTMAX_ROW_SOURCE))
    return (header + IMPORTS + "\n" + constants + "\n" + helpers + matmul.TILE_SOURCE + SOFTMAX_VECTOR_SOURCE
            + SOFTMAX_ROW_SOURCE + "\n" + driver)


def workspace_for(motif: str, dims: list[list[int]], scalars: list) -> int:
    """`workspace_elems` from the operands' dimensions (qkv, y) and scalars (heads, tokens,
    scale), as a command dispatches them: heads and tokens must be known before the call."""
    (_, (t, d)), (heads, tokens, _) = dims, scalars
    if heads is None or tokens is None:
        raise ValueError("heads and tokens decide the workspace, so they cannot depend on the call's arguments")
    heads, tokens = max(int(heads), 1), max(int(tokens), 1)
    return workspace_elems(t // tokens, tokens, heads, d // heads)


def launch_arguments(motif: str, values: list, workspace: np.ndarray) -> tuple:
    """The driver's arguments for a dispatch's operands, after the checks the motif's signature
    cannot make (they depend on its scalars); ValueError when one fails."""
    qkv, heads, tokens, scale, y = values
    heads, tokens = int(heads), int(tokens)
    t, c = qkv.shape
    d = y.shape[1]
    if heads < 1 or tokens < 1 or t % tokens:
        raise ValueError(f"{t} rows are not whole sequences of {tokens} tokens ({heads} heads)")
    if c != 3 * d or d % heads:
        raise ValueError(f"qkv {qkv.shape} and y {y.shape} are not q, k and v of {heads} heads side by side")
    if d // heads > MAX_HEAD_DIM:
        raise ValueError(f"heads of {d // heads} features; the motif takes at most {MAX_HEAD_DIM}")
    return qkv, y, heads, tokens, float(scale), workspace


def argument_examples(motif: str = "attention") -> tuple:
    """One value of each argument's exact type as dispatch passes them, for compiling ahead."""
    return np.zeros((1, 3), np.float32), np.zeros((1, 1), np.float32), 1, 1, 1.0, np.zeros(1, np.float32)


def load_function(motif: str = "attention", cache_dir: Path | None = None):
    """The compiled (lazily, then cached on disk) numba dispatcher: it takes
    (qkv, y, heads, tokens, scale, workspace)."""
    from loomc.lower.numba import ensure_module, load_module, module_path

    text = render_module(motif)
    path = module_path(text, cache_dir)
    ensure_module(path, text)
    return getattr(load_module(path), function_name(motif))

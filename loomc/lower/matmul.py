"""The matmul motifs on the cpu target: the compiler's own GEMM, batch-invariant by construction.

    matmul(a: f32[M, K], b: f32[N, K], out c: f32[M, N])
    matmul_f16(a: f32[M, K], b: f16[N, K], out c: f32[M, N])       f16 weights, widened exactly
    bmm(a: f32[G, M, K], b: f32[G, N, K], out c: f32[G, M, N])     G independent products

    c[g, m, n] = fma(a[g, m, K-1], b[g, n, K-1], ... fma(a[g, m, 0], b[g, n, 0], +0.0))

Every element of `c` is that one chain: a single accumulator, k in increasing order, one
rounding per step (fma). Nothing about the call changes it: not the other rows of `a`
(their number, order or padding), not the thread count, not the CPU's vector width. BLAS
gives no such promise (OpenBLAS picks micro-kernels and edge paths by shape and row
position, so a row's bits depended on its neighbours on AVX2 machines), which is why these
motifs never call it. An f16 weight widens to f32 exactly, so `matmul_f16` computes the
chain `matmul` would on the widened weights, from half the bytes.

How it runs (register blocking the way BLAS micro-kernels do, but never splitting k):

    pack:   ap[g, p, k, i] = a[g, 16 p + i, k]   (zero past M)       16 rows = one panel
    tiles:  parallel over (g, block of NR rows of b); in each, every panel p in turn:
            acc_j <16 x f32> += ap[g, p, k, :] * splat(b[g, n0 + j, k])   for k in 0..K, j < NR
            c[g, 16 p + i, n0 + j] = acc_j[i]

The tile body is LLVM IR emitted by `_lm_gemm_tile` (a numba intrinsic): NR vector
accumulators live in registers across the whole k loop (`tile_shape`: 12 on AVX-512, where
each is one zmm of 32; 6 on AVX2, where LLVM legalizes each <16 x float> into two of the 16
ymm; with 6 zmm accumulators an AVX-512 core waited on FMA latency: 12 measured 1.2-2x
faster on the recognizer's encoder shapes), and a machine without FMA gets the
correctly rounded library fma, so every target computes the same bits. A block of `b`'s
rows is read in place when it is whole f32, else copied once per block into an f32 buffer
(the last partial block, zero-padded; f16 rows, widened) that all its panels read. A
panel's lanes past M compute on zeros and are not stored.

Each motif is one generated module (like every kernel, `STYLE.md` §14) so numba caches it
on disk; the dispatcher takes (a, b, c, workspace) with the group dimension in front (1
for the unbatched motifs) and f16 weights as their uint16 bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loomc import LOOMC_VERSION



def _target_has_avx512() -> bool:
    """Whether numba generates AVX-512 code here: its configured target features
    (`NUMBA_CPU_FEATURES`, set when a machine class is emulated) else the host's."""
    from numba.core import config

    features = config.CPU_FEATURES
    if not features:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features().flatten()
    return "+avx512f" in features


def tile_shape() -> tuple[int, int]:
    """(rows of `a` per panel, rows of `b` per tile) for the machine's vector registers: one
    accumulator is <16 x f32>, one zmm on AVX-512 (32 registers: 12 accumulators), two ymm
    on AVX2 (16 registers: 6 accumulators, 12 ymm). The tile decides speed only: each output
    is the same one fma chain over k whatever its shape."""
    return (16, 12) if _target_has_avx512() else (16, 6)


PANEL_ROWS, TILE_COLS = tile_shape()   # rows of `a` per packed panel; rows of `b` per tile
UNROLL = 4  # steps of k per iteration of the tile loop

# The motifs this module serves: name -> (dtype of b, batched). Each is one generated module.
MOTIFS = {"matmul": ("f32", False), "matmul_f16": ("f16", False), "bmm": ("f32", True)}


def workspace_elems(groups: int, m: int, k: int) -> int:
    """f32 elements of the packed copy of `a` that one call needs (every group's panels)."""
    return groups * -(-m // PANEL_ROWS) * PANEL_ROWS * k


_TILE = '''
@intrinsic
def _lm_gemm_tile(typingctx, ap, a_off, b, b_off, ldb, kn, t):
    # t[j * MR + i] = fma chain over k < kn of ap[a_off + k * MR + i] * b[b_off + j * ldb + k],
    # continuing from the values in t: NR accumulators of <MR x f32> held in registers. The
    # main loop takes UNROLL steps of k per iteration, the tail loop one; both apply the
    # steps in increasing k, so the chain is the same whatever kn is.
    if not all(isinstance(x, types.Array) for x in (ap, b, t)):
        return None

    def codegen(context, builder, sig, args):
        from llvmlite import ir as llir

        ap_v, a_off_v, b_v, b_off_v, ldb_v, kn_v, t_v = args
        f32 = llir.FloatType()
        i32 = llir.IntType(32)
        i64 = llir.IntType(64)
        vec = llir.VectorType(f32, MR)
        ap_p = builder.gep(context.make_array(sig.args[0])(context, builder, ap_v).data, [a_off_v])
        b_base = builder.gep(context.make_array(sig.args[2])(context, builder, b_v).data, [b_off_v])
        rows = [builder.gep(b_base, [builder.mul(ldb_v, llir.Constant(i64, j))]) for j in range(NR)]
        t_p = context.make_array(sig.args[6])(context, builder, t_v).data
        fma = cgutils.get_or_insert_function(builder.module, llir.FunctionType(vec, [vec, vec, vec]),
                                             "llvm.fma.v%df32" % MR)
        undef = llir.Constant(vec, None)
        splat = llir.Constant(llir.VectorType(i32, MR), [0] * MR)

        def vptr(base, index):
            return builder.bitcast(builder.gep(base, [index]), vec.as_pointer())

        def step(k, accs):
            a = builder.load(vptr(ap_p, builder.mul(k, llir.Constant(i64, MR))), align=4)
            out = []
            for row, acc in zip(rows, accs):
                bj = builder.load(builder.gep(row, [k]))
                bv = builder.shuffle_vector(builder.insert_element(undef, bj, llir.Constant(i32, 0)), undef, splat)
                out.append(builder.call(fma, [a, bv, acc]))
            return out

        def counted_loop(name, k0, accs0, stride, bound):
            # for k = k0; k + stride <= bound; k += stride: accs = step(k) .. step(k + stride - 1)
            entry = builder.block
            body = builder.append_basic_block(name + ".body")
            done = builder.append_basic_block(name + ".done")
            last = llir.Constant(i64, stride)
            builder.cbranch(builder.icmp_signed("<=", builder.add(k0, last), bound), body, done)
            builder.position_at_end(body)
            k = builder.phi(i64)
            phis = [builder.phi(vec) for _ in accs0]
            k.add_incoming(k0, entry)
            for phi, acc in zip(phis, accs0):
                phi.add_incoming(acc, entry)
            accs = phis
            for u in range(stride):
                accs = step(builder.add(k, llir.Constant(i64, u)), accs)
            k_next = builder.add(k, last)
            k.add_incoming(k_next, builder.block)
            for phi, acc in zip(phis, accs):
                phi.add_incoming(acc, builder.block)
            builder.cbranch(builder.icmp_signed("<=", builder.add(k_next, last), bound), body, done)
            builder.position_at_end(done)
            k_out = builder.phi(i64)
            k_out.add_incoming(k0, entry)
            k_out.add_incoming(k_next, body)
            outs = [builder.phi(vec) for _ in accs0]
            for out, start, acc in zip(outs, accs0, accs):
                out.add_incoming(start, entry)
                out.add_incoming(acc, body)
            return k_out, outs

        start = [builder.load(vptr(t_p, llir.Constant(i64, j * MR)), align=4) for j in range(NR)]
        k, accs = counted_loop("tile.main", llir.Constant(i64, 0), start, UNROLL, kn_v)
        _, accs = counted_loop("tile.tail", k, accs, 1, kn_v)
        for j, acc in enumerate(accs):
            builder.store(acc, vptr(t_p, llir.Constant(i64, j * MR)), align=4)
        return context.get_dummy_value()

    return types.none(ap, a_off, b, b_off, ldb, kn, t), codegen
'''

_DRIVER = '''
@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")
def FUNCTION(a, b, c, ap):
    # c[g] = a[g] . b[g]^T  (a: [G, M, K], b: [G, N, K] (f16: its uint16 bits), c: [G, M, N]);
    # ap: the packed panels of a, panel p of group g at (g * panels + p) * K * MR
    G, M, K = a.shape
    N = b.shape[1]
    panels = (M + MR - 1) // MR
    for gp in prange(G * panels):
        g = gp // panels
        p = gp - g * panels
        base = gp * K * MR
        for i in range(MR):
            m = p * MR + i
            if m < M:
                for k in range(K):
                    ap[base + k * MR + i] = a[g, m, k]
            else:
                for k in range(K):
                    ap[base + k * MR + i] = np.float32(0.0)
    blocks = (N + NR - 1) // NR
    b_flat = b.reshape(-1)
    for gb in prange(G * blocks):
        g = gb // blocks
        n0 = (gb - g * blocks) * NR
        cols = min(NR, N - n0)
        ROWS_OF_B
        t = carray(_lm_alloca(NR * MR, np.float32), (NR * MR,))
        for p in range(panels):
            for i in range(NR * MR):
                t[i] = np.float32(0.0)
            _lm_gemm_tile(ap, (g * panels + p) * K * MR, src, off, K, K, t)
            for i in range(min(MR, M - p * MR)):
                for j in range(cols):
                    c[g, p * MR + i, n0 + j] = t[j * MR + i]
'''

# How a block of NR rows of b reaches the tile: f32 rows in place (a copy, zero-padded, only
# for the last partial block); f16 rows widened (exactly) into an f32 copy once per block,
# which every panel of the block then reads.
_ROWS_OF_B = {
    "f32": '''if cols == NR:
            src = b_flat
            off = (g * N + n0) * K
        else:
            src = np.zeros(NR * K, np.float32)
            off = 0
            for j in range(cols):
                for k in range(K):
                    src[j * K + k] = b[g, n0 + j, k]''',
    "f16": '''src = np.zeros(NR * K, np.float32)
        off = 0
        for j in range(cols):
            for k in range(K):
                src[j * K + k] = _lm_f16_from_bits(b[g, n0 + j, k])''',
}


def function_name(motif: str) -> str:
    return f"k_{motif}"


def render_module(motif: str = "matmul") -> str:
    """The generated numba module of one motif, written to the kernel cache like every kernel."""
    import numba

    from loomc.lower.numba_helpers import IMPORTS, helpers_for

    b_dtype, batched = MOTIFS[motif]
    header = (f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.\n"
              f"# motif {motif}: c[g, m, n] = fma chain over k of a[g, m, k] * b[g, n, k] "
              f"({b_dtype} b{', batched' if batched else ''}; loomc/lower/matmul.py), tile {PANEL_ROWS} x {TILE_COLS}\n")
    constants = f"MR = {PANEL_ROWS}\nNR = {TILE_COLS}\nUNROLL = {UNROLL}\n"
    driver = _DRIVER.replace("FUNCTION", function_name(motif)).replace("ROWS_OF_B", _ROWS_OF_B[b_dtype])
    driver = driver.replace("NR * MR", str(PANEL_ROWS * TILE_COLS))
    helpers = "".join(h + "\n\n" for h in helpers_for(driver))
    return header + IMPORTS + "\n" + constants + "\n" + helpers + _TILE + "\n" + driver


def argument_examples(motif: str = "matmul") -> tuple:
    """One value of each argument's exact type as dispatch passes them (a, b, c with their group
    dimension in front; f16 b as its uint16 bits; the f32 workspace), for compiling ahead."""
    b_type = np.uint16 if MOTIFS[motif][0] == "f16" else np.float32
    return (np.zeros((1, 1, 1), np.float32), np.zeros((1, 1, 1), b_type), np.zeros((1, 1, 1), np.float32),
            np.zeros(1, np.float32))


def load_function(motif: str = "matmul", cache_dir: Path | None = None):
    """The compiled (lazily, then cached on disk) numba dispatcher of `motif`: it takes
    (a, b, c, workspace) with a group dimension in front (1 for the unbatched motifs)."""
    from loomc.lower.numba import ensure_module, load_module, module_path

    text = render_module(motif)
    path = module_path(text, cache_dir)
    ensure_module(path, text)   # a damaged entry is written again, never imported
    return getattr(load_module(path), function_name(motif))

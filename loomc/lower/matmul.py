"""The `matmul` motif on the cpu target: the compiler's own f32 GEMM, batch-invariant by construction.

    c[m, n] = fma(a[m, K-1], b[n, K-1], ... fma(a[m, 1], b[n, 1], fma(a[m, 0], b[n, 0], +0.0)))

Every element of `c` is that one chain: a single accumulator, k in increasing order, one
rounding per step (fma). Nothing about the call changes it: not the other rows of `a`
(their number, order or padding), not the thread count, not the CPU's vector width. BLAS
gives no such promise (OpenBLAS picks micro-kernels and edge paths by shape and row
position, so a row's bits depended on its neighbours on AVX2 machines), which is why this
motif no longer calls it.

How it runs (register blocking the way BLAS micro-kernels do, but never splitting k):

    pack:   ap[p, k, i] = a[16 p + i, k]          (zero past M)      16 rows = one panel
    tiles:  parallel over (n block of 6 rows of b) x (panel p)
            acc_j <16 x f32> += ap[p, k, :] * splat(b[n0 + j, k])   for k in 0..K, j < 6
            c[16 p + i, n0 + j] = acc_j[i]

The tile body is LLVM IR emitted by `_lm_gemm_tile` (a numba intrinsic): six vector
accumulators live in registers across the whole k loop; on AVX-512 each is one zmm, on
AVX2 two ymm (LLVM legalizes the <16 x float>), and a machine without FMA gets the
correctly rounded library fma, so every target computes the same bits. Rows of `b` past
N are never read: the last partial block of rows is copied into a zero-padded buffer.
A panel's lanes past M compute on zeros and are not stored.

The module is generated text (like every kernel, `STYLE.md` §14) so numba caches it on disk.
"""

from __future__ import annotations

from pathlib import Path

from loomc import LOOMC_VERSION

PANEL_ROWS = 16  # rows of `a` per packed panel: the vector width of the tile
TILE_COLS = 6  # rows of `b` (columns of `c`) per tile: six accumulators
UNROLL = 4  # steps of k per iteration of the tile loop
FUNCTION = "k_matmul_f32"


def workspace_elems(m: int, k: int) -> int:
    """f32 elements of the packed copy of `a` that one call needs."""
    return -(-m // PANEL_ROWS) * PANEL_ROWS * k


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
    # c = a . b^T (a: [M, K], b: [N, K], c: [M, N]); ap: the packed panels of a
    M, K = a.shape
    N = b.shape[0]
    panels = (M + MR - 1) // MR
    for p in prange(panels):
        for i in range(MR):
            m = p * MR + i
            for k in range(K):
                ap[(p * K + k) * MR + i] = a[m, k] if m < M else np.float32(0.0)
    blocks = (N + NR - 1) // NR
    b_flat = b.reshape(-1)
    for job in prange(blocks * panels):
        block = job // panels
        p = job - block * panels
        n0 = block * NR
        cols = min(NR, N - n0)
        rows = min(MR, M - p * MR)
        t = carray(_lm_alloca(NR * MR, np.float32), (NR * MR,))
        for i in range(NR * MR):
            t[i] = np.float32(0.0)
        if cols == NR:
            _lm_gemm_tile(ap, p * K * MR, b_flat, n0 * K, K, K, t)
        else:
            pad = np.zeros(NR * K, np.float32)
            for j in range(cols):
                for k in range(K):
                    pad[j * K + k] = b[n0 + j, k]
            _lm_gemm_tile(ap, p * K * MR, pad, 0, K, K, t)
        for i in range(rows):
            for j in range(cols):
                c[p * MR + i, n0 + j] = t[j * MR + i]
'''


def render_module() -> str:
    """The generated numba module of the motif, written to the kernel cache like every kernel."""
    import numba

    from loomc.lower.numba_helpers import IMPORTS, helpers_for

    header = (f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.\n"
              f"# motif matmul: c[m, n] = fma chain over k of a[m, k] * b[n, k] "
              f"(loomc/lower/matmul.py), tile {PANEL_ROWS} x {TILE_COLS}\n")
    constants = f"MR = {PANEL_ROWS}\nNR = {TILE_COLS}\nUNROLL = {UNROLL}\n"
    driver = _DRIVER.replace("FUNCTION", FUNCTION).replace("NR * MR", str(PANEL_ROWS * TILE_COLS))
    helpers = "".join(h + "\n\n" for h in helpers_for(driver))
    return header + IMPORTS + "\n" + constants + "\n" + helpers + _TILE + "\n" + driver


def load_function(cache_dir: Path | None = None):
    """The compiled (lazily, then cached on disk) numba dispatcher of the motif."""
    from loomc.files import write_atomically
    from loomc.lower.numba import load_module, module_path

    text = render_module()
    path = module_path(text, cache_dir)
    if not path.exists():
        write_atomically(path, text, parents=True)
    return getattr(load_module(path), FUNCTION)

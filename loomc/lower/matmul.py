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

How it runs (register and cache blocking the way BLAS does, but never splitting a chain):

    tasks:  parallel over (g, chunk of b's rows, panel of 16 rows of a), chunk outer, so a
            chunk of b (up to CHUNK_ELEMS f32, within a core's L2) is reused by every panel
    slices: a task walks k in slices of K_SLICE; it packs its panel's slice
            pk[k, i] = a[g, 16 p + i, k0 + k] (zero past M; 16 KiB, in L1) and, for each
            block of NR rows of b in the chunk:
            acc_j <16 x f32> += pk[k, :] * splat(b[g, n0 + j, k0 + k])  for k in the slice, j < NR
            the accumulators carried from slice to slice (the first slice starts them at
            +0.0 in registers, nothing zeroed or loaded), so k still runs 0..K in order
            c[g, 16 p + i, n0 + j] = acc_j[i] after the last slice, a whole tile stored as
            vectors (8 x 8 blocks transposed by shuffles: `_lm_store_tile_t`)
    swapped: when a has more rows than b and b at most SWAP_N (a convolution's columns
            against its weights), b is the packed side and a's rows, read in place, the
            broadcast side: the large operand is never copied (8192 x 288 . 32 x 288:
            147 -> 286 GFLOP/s, past OpenBLAS's 205); when the packed b outgrows a chunk,
            a task takes SWAP_GROUP blocks of a's rows, so each slice of a panel of b is read
            from L3 once per 4 blocks instead of once per block

The tile body is LLVM IR emitted by `_lm_gemm_tile` (a numba intrinsic): NR vector
accumulators live in registers across the whole k loop (`tile_shape`: 16 on AVX-512, where
each is one zmm of 32; 6 on AVX2, where LLVM legalizes each <16 x float> into two of the 16
ymm; with 6 zmm accumulators an AVX-512 core waited on FMA latency: 12 measured 1.2-2x
faster on the recognizer's encoder shapes, and 16 another 1.1-1.25x over 12 on conv and
encoder shapes, whose N are multiples of 16; 20-28 were slower), and a machine without FMA gets the
correctly rounded library fma, so every target computes the same bits. Whole f32 blocks of
`b` are read in place, the last partial block from a zero-padded copy; f16 weights are
widened once per call into the workspace (when `a` has several panels) or per block by
the task that reads them (decode). A panel's lanes past M compute on zeros and are not
stored. Before this order (tasks over blocks of b, each streaming every packed panel of
a), a conv's im2col columns (8192 x 864 . 32 x 864) were read from memory once per block:
51 GFLOP/s there, 140 now (BLAS: 200); 2 threads, Xeon AVX-512.

Two tiles (AVX-512): the narrow one above (panels of 16 rows, 16 broadcasts) and a wide one
(`wide_tile_shape`: panels of 32 rows, each accumulator <32 x f32> in two zmm, 8 broadcasts,
k in slices of 192), which loads 10 values per 16 fma instead of 17: 1.05-1.35x faster where
its panels are full. Each generated module holds both drivers (names suffixed _n and _w) and
an entry that picks one by the call's shape (`tile_for`); every element is the same chain on
either, so the choice never changes a bit. Elsewhere the wide tile does not exist.

Each motif is one generated module (like every kernel, `STYLE.md` §14) so numba caches it
on disk; the dispatcher takes (a, b, c, workspace) with the group dimension in front (1
for the unbatched motifs) and f16 weights as their uint16 bits.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from loomc import LOOMC_VERSION



def target_has(feature: str) -> bool:
    """Whether numba generates code with the LLVM target `feature` here ("avx512f",
    "avx512vnni", ...): its configured target features (`NUMBA_CPU_FEATURES`, set when a
    machine class is emulated) else the host's."""
    from numba.core import config

    features = config.CPU_FEATURES
    if not features:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features().flatten()
    return "+" + feature in features.split(",")


def _target_has_avx512() -> bool:
    return target_has("avx512f")


def tile_shape() -> tuple[int, int]:
    """(rows of `a` per panel, rows of `b` per tile) for the machine's vector registers: one
    accumulator is <16 x f32>, one zmm on AVX-512 (32 registers: 16 accumulators), two ymm
    on AVX2 (16 registers: 6 accumulators, 12 ymm). The tile decides speed only: each output
    is the same one fma chain over k whatever its shape."""
    return (16, 16) if _target_has_avx512() else (16, 6)


def wide_tile_shape() -> tuple[int, int] | None:
    """The second tile of the matmul motifs, on AVX-512 only: each accumulator two zmm (32 rows
    of the panel) across 8 broadcasts, so a step of k loads 2 vectors and 8 scalars for 16 fma,
    where the narrow tile loads 1 and 16. 1.05-1.35x faster wherever its panels are full
    (the ViT's, the encoders' and the convolutions' shapes; `tile_for`). AVX2 has no registers
    for it: there the narrow tile is already two ymm per accumulator."""
    return (32, 8) if _target_has_avx512() else None


PANEL_ROWS, TILE_COLS = tile_shape()   # rows of `a` per packed panel; rows of `b` per tile (the narrow tile)
WIDE_TILE = wide_tile_shape()
WIDE_K_SLICE = 192   # the wide panel's slice: 192 x 32 f32 (24 KiB, in L1)
UNROLL = 4  # steps of k per iteration of the tile loop
CHUNK_ELEMS = 1 << 18  # f32 elements of b per chunk (1 MiB: half a core's L2 on the machines we run on)
WIDE_LIMIT = 1 << 23  # most f32 elements (32 MiB) of an f16 weight widened once per call
# tasks a call aims for when b's chunks, not a's panels, must supply them, and the most blocks
# of b per chunk, whose accumulators (64 KiB) live on the task's stack: 16 and 64 (32 and 32
# before) measured 2-10% faster on 170-220-row shapes (the speaker's), the same elsewhere
TASKS = 16
ACC_BLOCKS = 64
SWAP_GROUP = 4  # blocks of a's rows per task on the swapped path when the packed b outgrows a chunk
SWAP_N = 512  # most rows of b for which a call with more rows of a swaps the roles (a read in place)
SHORT_K = 128  # at most this depth the roles swap whenever b fits SWAP_N: see `swapped`
SWAP_NEAR_M = 96  # at least this many rows of a swap the roles when b (at most SWAP_N rows) has not many more: see `swapped`
K_SLICE = 384  # steps of k per packed slice of a panel (24 KiB, in L1; 384 = a common model width, unsplit)

# The motifs this module serves: name -> (dtype of b, batched). Each is one generated module.
MOTIFS = {"matmul": ("f32", False), "matmul_f16": ("f16", False), "bmm": ("f32", True)}


# `swapped` as the generated drivers and entries test it, over their M, K and N
SWAPPED_TEST = "M > SWAP_MIN_M and ((N <= SWAP_N and (M > N or (M >= SWAP_NEAR_M and 10 * M >= 7 * N))) or K <= SHORT_K)"


def swapped(m: int, k: int, n: int) -> bool:
    """Whether a call runs with the roles swapped (b packed, a read in place; the driver
    decides the same). When b has at most SWAP_N rows and a has more, or at least
    SWAP_NEAR_M and seven tenths of b's (the speaker's 200 x 768 . 256: 1.06-1.15x, its
    32-row panels of b fill their lanes where a's 200 rows filled 224; 96-224 x 384 . 128-256
    1.03-1.09x; fewer rows of a left too few tasks: 64 x 384 . 64 0.69x, 100 x 384 . 512
    0.90x); and, whatever b's rows, when k is short: then the store of each tile is a large
    part of its work, and only the swapped tile stores rows of c as whole vectors (attention
    scores, q . k^T over 64 features: 48 x 257 . 257 125 -> 159 GFLOP/s, 12 x 1500 . 1500 131
    -> 147 GFLOP/s)."""
    near = m >= SWAP_NEAR_M and 10 * m >= 7 * n
    return m > PANEL_ROWS and ((n <= SWAP_N and (m > n or near)) or k <= SHORT_K)


def workspace_elems(motif: str, groups: int, m: int, k: int, n: int) -> int:
    """f32 elements of the workspace one call of `motif` wants (the generated driver makes
    the same decisions from the same shapes): a packed copy of a, [G, panels, K, MR], when
    a is read more than once (b in several chunks) or, for f16 b not widened per call, k is
    not sliced; then f32 b: the zero-padded copy of each group's last partial block of rows;
    f16 b: the weights widened once per call ([G, N rounded up to NR, K]) when a spans
    several panels and that copy stays under WIDE_LIMIT elements (else each task widens its
    own blocks)."""
    mr, nr, kc = tile_for(m, k, n)
    if swapped(m, k, n):   # roles swapped: b packed, a's last block padded
        return groups * -(-n // mr) * mr * k + (groups * nr * k if m % nr else 0)
    panels, blocks = -(-m // mr), -(-n // nr)
    per_chunk = max(1, min(CHUNK_ELEMS // (nr * max(k, 1)), -(-blocks * panels // TASKS), ACC_BLOCKS))
    chunks = -(-blocks // per_chunk)   # (the driver then evens the chunks out: the same count)
    if MOTIFS[motif][0] == "f32":
        prepack, extra = chunks > 1, groups * nr * k if n % nr else 0
    else:
        wide_elems = groups * blocks * nr * k
        wide = panels > 1 and wide_elems <= WIDE_LIMIT
        prepack, extra = chunks > 1 or (not wide and k > kc), wide_elems if wide else 0
    return (groups * panels * mr * k if prepack else 0) + extra


def attention_tile() -> tuple[int, int, int]:
    """(rows per panel, rows per tile, k per slice) for the fused attention motif
    (loomc/lower/attention.py): the wide tile where there is one. Its panels are a head's keys
    (a sequence's length) and features (32 or 64 in our models), which the wide panels fill as
    well as the narrow ones (2056 x 257 . 64 scores 1.4x, their values 1.5x faster as bmm)."""
    return WIDE_TILE + (WIDE_K_SLICE,) if WIDE_TILE else (PANEL_ROWS, TILE_COLS, K_SLICE)


def _round_up(x: int, step: int) -> int:
    return -(-x // step) * step


def tile_for(m: int, k: int, n: int) -> tuple[int, int, int]:
    """(rows per panel, rows per tile, k per slice) of the tile a call runs with (the generated
    entry decides the same): the wide tile when its panels, of a's rows or, roles swapped, of
    b's, compute at most a tenth more padding lanes than the narrow tile's (48 or 80 rows
    measured 5% slower on the wide tile; 96, 257 and 2056 8-16% faster)."""
    panel_side = n if swapped(m, k, n) else m
    if WIDE_TILE and panel_side >= WIDE_TILE[0] and (
            _round_up(panel_side, WIDE_TILE[0]) * 10 <= _round_up(panel_side, PANEL_ROWS) * 11):
        return WIDE_TILE + (WIDE_K_SLICE,)
    return PANEL_ROWS, TILE_COLS, K_SLICE


TILE_SOURCE = '''
def _lm_tile_codegen(strided, fresh=False):
    # The tile body for `_lm_gemm_tile` (strided False: ldk 1, all NR rows), `_lm_gemm_tile_rows`
    # (strided: b's k stride ldk, only rows j < valid read and stored) and `_lm_gemm_tile_fresh`
    # (fresh: a last argument that, when true, starts the chains from +0.0 instead of t's values)
    def codegen(context, builder, sig, args):
        from llvmlite import ir as llir

        f32 = llir.FloatType()
        i32 = llir.IntType(32)
        i64 = llir.IntType(64)
        if fresh:
            start_fresh = context.cast(builder, args[-1], sig.args[-1], types.boolean)
            args = args[:-1]
        if strided:
            ap_v, a_off_v, b_v, b_off_v, ldb_v, ldk_v, valid_v, kn_v, t_v, ldt_v = args
            t_arg = 8
        else:
            ap_v, a_off_v, b_v, b_off_v, ldb_v, kn_v, t_v, ldt_v = args
            ldk_v, valid_v, t_arg = llir.Constant(i64, 1), llir.Constant(i64, NR), 6
        vec = llir.VectorType(f32, MR)
        ap_p = builder.gep(context.make_array(sig.args[0])(context, builder, ap_v).data, [a_off_v])
        b_base = builder.gep(context.make_array(sig.args[2])(context, builder, b_v).data, [b_off_v])
        live = [builder.icmp_signed("<", llir.Constant(i64, j), valid_v) for j in range(NR)]
        # a row past `valid` reads row 0 (memory that exists) and is never stored
        rows = [builder.gep(b_base, [builder.select(live[j], builder.mul(ldb_v, llir.Constant(i64, j)),
                                                    llir.Constant(i64, 0))]) for j in range(NR)]
        t_p = context.make_array(sig.args[t_arg])(context, builder, t_v).data
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
                bj = builder.load(builder.gep(row, [k if not strided else builder.mul(k, ldk_v)]))
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

        t_rows = [builder.select(live[j], builder.mul(ldt_v, llir.Constant(i64, j)), llir.Constant(i64, 0))
                  for j in range(NR)]
        if fresh:   # +0.0 in every lane (what a zeroed t holds), else t's values
            entry = builder.block
            load_bb = builder.append_basic_block("tile.load")
            start_bb = builder.append_basic_block("tile.start")
            builder.cbranch(start_fresh, start_bb, load_bb)
            builder.position_at_end(load_bb)
            loaded = [builder.load(vptr(t_p, t_rows[j]), align=4) for j in range(NR)]
            builder.branch(start_bb)
            builder.position_at_end(start_bb)
            start = []
            for value in loaded:
                phi = builder.phi(vec)
                phi.add_incoming(llir.Constant(vec, [0.0] * MR), entry)
                phi.add_incoming(value, load_bb)
                start.append(phi)
        else:
            start = [builder.load(vptr(t_p, t_rows[j]), align=4) for j in range(NR)]
        k, accs = counted_loop("tile.main", llir.Constant(i64, 0), start, UNROLL, kn_v)
        _, accs = counted_loop("tile.tail", k, accs, 1, kn_v)
        for j, acc in enumerate(accs):
            if strided:
                with builder.if_then(live[j]):
                    builder.store(acc, vptr(t_p, t_rows[j]), align=4)
            else:
                builder.store(acc, vptr(t_p, t_rows[j]), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def _lm_gemm_tile(typingctx, ap, a_off, b, b_off, ldb, kn, t, ldt):
    # t[j * ldt + i] = fma chain over k < kn of ap[a_off + k * MR + i] * b[b_off + j * ldb + k],
    # continuing from the values in t: NR accumulators of <MR x f32> held in registers. The
    # main loop takes UNROLL steps of k per iteration, the tail loop one; both apply the
    # steps in increasing k, so the chain is the same whatever kn is.
    if not all(isinstance(x, types.Array) for x in (ap, b, t)):
        return None
    return types.none(ap, a_off, b, b_off, ldb, kn, t, ldt), _lm_tile_codegen(False)


def _lm_store_codegen(transposed):
    # The body of `_lm_store_tile` / `_lm_store_tile_t`: NR x MR accumulators out to c as
    # whole vectors (transposed: 8 x 8 blocks turned by three rounds of two-source shuffles,
    # then one 8-wide store per row of c; a tile whose sides are not multiples of 8 moves
    # element by element, unrolled). Data movement only: the bits are the accumulators'.
    def codegen(context, builder, sig, args):
        from llvmlite import ir as llir

        f32 = llir.FloatType()
        i32 = llir.IntType(32)
        i64 = llir.IntType(64)
        acc_v, acc_off_v, c_v, c_off_v, ldc_v = args
        acc_p = builder.gep(context.make_array(sig.args[0])(context, builder, acc_v).data, [acc_off_v])
        c_p = builder.gep(context.make_array(sig.args[2])(context, builder, c_v).data, [c_off_v])

        def at(base, index, width):   # pointer to `width` f32 at base + index (index an i64 value)
            ptr = builder.gep(base, [index])
            return builder.bitcast(ptr, llir.VectorType(f32, width).as_pointer()) if width > 1 else ptr

        def const(x):
            return llir.Constant(i64, x)

        if not transposed:
            for j in range(NR):
                row = builder.load(at(acc_p, const(j * MR), MR), align=4)
                builder.store(row, at(c_p, builder.mul(ldc_v, const(j)), MR), align=4)
        elif MR % 8 == 0 and NR % 8 == 0:
            masks = ([0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15], [0, 1, 8, 9, 4, 5, 12, 13],
                     [2, 3, 10, 11, 6, 7, 14, 15], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])

            def shuffle(x, y, mask):
                return builder.shuffle_vector(x, y, llir.Constant(llir.VectorType(i32, 8), mask))

            for jb in range(NR // 8):
                for ib in range(MR // 8):
                    r = [builder.load(at(acc_p, const((jb * 8 + j) * MR + ib * 8), 8), align=4) for j in range(8)]
                    t = []
                    for x, y in zip(r[0::2], r[1::2]):
                        t += [shuffle(x, y, masks[0]), shuffle(x, y, masks[1])]
                    u = []
                    for h in (0, 4):
                        u += [shuffle(t[h], t[h + 2], masks[2]), shuffle(t[h], t[h + 2], masks[3]),
                              shuffle(t[h + 1], t[h + 3], masks[2]), shuffle(t[h + 1], t[h + 3], masks[3])]
                    cols = [shuffle(u[i], u[i + 4], masks[4]) for i in range(4)] + [shuffle(u[i], u[i + 4], masks[5]) for i in range(4)]
                    for i, col in enumerate(cols):   # cols[i][j] = acc row jb * 8 + j, lane ib * 8 + i
                        off = builder.add(builder.mul(ldc_v, const(ib * 8 + i)), const(jb * 8))
                        builder.store(col, at(c_p, off, 8), align=4)
        else:
            for i in range(MR):
                for j in range(NR):
                    x = builder.load(at(acc_p, const(j * MR + i), 1))
                    builder.store(x, at(c_p, builder.add(builder.mul(ldc_v, const(i)), const(j)), 1))
        return context.get_dummy_value()

    return codegen


@intrinsic
def _lm_store_tile(typingctx, acc, acc_off, c, c_off, ldc):
    # c[c_off + j * ldc + i] = acc[acc_off + j * MR + i] for j < NR, i < MR: a whole tile's
    # accumulators, rows of MR lanes, out to rows of c
    if not all(isinstance(x, types.Array) for x in (acc, c)):
        return None
    return types.none(acc, acc_off, c, c_off, ldc), _lm_store_codegen(False)


@intrinsic
def _lm_store_tile_t(typingctx, acc, acc_off, c, c_off, ldc):
    # c[c_off + i * ldc + j] = acc[acc_off + j * MR + i] for j < NR, i < MR: a whole tile's
    # accumulators out to c transposed (the panel's lanes are c's rows)
    if not all(isinstance(x, types.Array) for x in (acc, c)):
        return None
    return types.none(acc, acc_off, c, c_off, ldc), _lm_store_codegen(True)


@intrinsic
def _lm_gemm_tile_fresh(typingctx, ap, a_off, b, b_off, ldb, kn, t, ldt, fresh):
    # _lm_gemm_tile, but when `fresh` the chains start from +0.0, not from t's values: the
    # first slice of k needs no zeroed accumulators
    if not all(isinstance(x, types.Array) for x in (ap, b, t)):
        return None
    return types.none(ap, a_off, b, b_off, ldb, kn, t, ldt, fresh), _lm_tile_codegen(False, True)


@intrinsic
def _lm_gemm_tile_rows(typingctx, ap, a_off, b, b_off, ldb, ldk, valid, kn, t, ldt):
    # _lm_gemm_tile with b[b_off + j * ldb + k * ldk] (b read in place in any layout: its
    # elements are loaded one at a time anyway) for the rows j < valid only: rows past it are
    # neither read from b nor t, nor stored
    if not all(isinstance(x, types.Array) for x in (ap, b, t)):
        return None
    return types.none(ap, a_off, b, b_off, ldb, ldk, valid, kn, t, ldt), _lm_tile_codegen(True)
'''

# The copies every driver makes, one template each (rendered per source dtype): a panel of MR
# rows of x transposed, ws[base + k * MR + i] = x[g, p * MR + i, k], the vector side of the
# tile; and a zero-padded block of NR rows, ws[base + j * K + k] = x[g, first + j, k], the
# broadcast side's last partial block. Rows past x's are zeros. The panel is written in order
# (k outer, MR rows read side by side): row by row, a panel larger than L1 (K > 192) was
# written a cache line at a time, 16 times over (448 x 1536 . 384: 179 -> 249 GFLOP/s).
PACK_SOURCE = '''
@njit(cache=True)
def NAME(x, g, p, ws, base):
    rows, depth = x.shape[1], x.shape[2]
    full = min(MR, rows - p * MR)
    for k in range(depth):
        for i in range(MR):
            r = p * MR + i
            ws[np.uint64(base + k * MR + i)] = VALUE if i < full else np.float32(0.0)
'''

PAD_SOURCE = '''
@njit(cache=True)
def _lm_pad_rows(x, g, first, ws, base):
    rows, depth = x.shape[1], x.shape[2]
    for j in range(NR):
        for k in range(depth):
            ws[base + j * depth + k] = x[g, first + j, k] if first + j < rows else np.float32(0.0)
'''


def pack_source(name: str, dtype: str) -> str:
    """PACK_SOURCE as the helper `name` for sources of `dtype` (f16: their bits, widened exactly)."""
    value = "x[g, r, k]" if dtype == "f32" else "_lm_f16_from_bits(x[g, r, k])"
    return PACK_SOURCE.replace("NAME", name).replace("VALUE", value)


_DRIVER = '''
@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")
def FUNCTION(a, b, c, ws):
    # c[g] = a[g] . b[g]^T  (a: [G, M, K], b: [G, N, K] (f16: its uint16 bits), c: [G, M, N]).
    # Tasks (g, chunk of b's rows, panel of a), chunk outer: a chunk of b stays in the core's
    # L2 while the panels stream past. A task walks k in slices of KC, each block of the
    # chunk running over the panel's slice with its accumulators kept in `acc` between
    # slices, so every output is still one fma chain in increasing k. The panel's slice is
    # packed by the task itself (on its stack, L1-sized) when a is read once (one chunk);
    # else all of a is packed once into ws, [G, panels, K, MR], before the tasks.
    G, M, K = a.shape
    N = b.shape[1]
    panels = (M + MR - 1) // MR
    blocks = (N + NR - 1) // NR
    kc = min(K, KC)
    slices = (K + kc - 1) // max(kc, 1)
    # blocks per chunk: as many as fit CHUNK_ELEMS, but few enough that there are about
    # TASKS tasks when a has few panels (decode), so both cores get balanced work
    per_chunk = max(1, min(CHUNK_ELEMS // (NR * max(K, 1)), (blocks * panels + TASKS - 1) // TASKS, ACC_BLOCKS))
    chunks = (blocks + per_chunk - 1) // per_chunk
    per_chunk = (blocks + chunks - 1) // chunks   # chunks of even size (72 blocks: 36 + 36, not 42 + 30)
    b_flat = b.reshape(-1)
    c_flat = c.reshape(-1)   # stores index it unsigned: no negative-index wrap, so they vectorize
    if SWAPPED_TEST:   # `swapped`
        # Many rows of a, few of b (a convolution's columns), or a short k: the roles swap.
        # b is packed once, in panels of MR rows, as the vector side; a's rows are read in
        # place as the broadcast side, NR at a time (the last partial block from a zero-padded
        # copy), so the large operand is never copied. A task's accumulators cover at most
        # SWAP_N rows of b: more run as several passes over the same rows of a, each over all
        # of k. Same chains: c[m, n] over k in order from +0.0.
        bpan = (N + MR - 1) // MR
        ablocks = (M + NR - 1) // NR
        packed_b = G * bpan * K * MR
        if ws.size < packed_b + (G * NR * K if M % NR else 0):
            raise ValueError("matmul: workspace smaller than workspace_elems")
        for gp in prange(G * bpan):
            _lm_pack_b(b, gp // bpan, gp % bpan, ws, gp * K * MR)
        if M % NR:
            for g in range(G):
                _lm_pad_rows(a, g, (ablocks - 1) * NR, ws, packed_b + g * NR * K)
        a_flat = a.reshape(-1)
        if bpan <= SWAP_PANELS:
            # One pass. When the packed b is larger than a chunk (it would stream from L3 once
            # per block of a: k of 1536), a task takes SWAP_GROUP blocks of a's rows and runs
            # each slice of a panel of b over all of them while it is in L1 (2056 x 1536 . 384:
            # 220 -> 252 GFLOP/s); else one block (grouped, 2056 x 384 . 384 measured 8% slower).
            ag = SWAP_GROUP if bpan * K * MR > CHUNK_ELEMS and G * ablocks >= 16 * SWAP_GROUP else 1
            agroups = (ablocks + ag - 1) // ag
            for task in prange(G * agroups):
                g = task // agroups
                q0 = (task - g * agroups) * ag
                nq = min(ag, ablocks - q0)
                acc = carray(_lm_alloca(SWAP_GROUP_ACC_ELEMS, np.float32), (SWAP_GROUP_ACC_ELEMS,))
                if K == 0:   # (k empty: else the first slice starts every chain from +0.0)
                    for i in range(nq * bpan * NR * MR):
                        acc[i] = np.float32(0.0)
                for s in range(slices):
                    k0 = s * kc
                    kn = min(kc, K - k0)
                    for p in range(bpan):
                        for q in range(nq):
                            m0 = (q0 + q) * NR
                            if m0 + NR <= M:
                                src = a_flat
                                off = (g * M + m0) * K + k0
                            else:
                                src = ws
                                off = packed_b + g * NR * K + k0
                            _lm_gemm_tile_fresh(ws, ((g * bpan + p) * K + k0) * MR, src, off, K, kn, acc[(q * bpan + p) * NR * MR:], MR, s == 0)
                for q in range(nq):
                    m0 = (q0 + q) * NR
                    for p in range(bpan):
                        if m0 + NR <= M and (p + 1) * MR <= N:
                            _lm_store_tile(acc, (q * bpan + p) * NR * MR, c_flat, (g * M + m0) * N + p * MR, N)
                            continue
                        for j in range(min(NR, M - m0)):
                            for i in range(min(MR, N - p * MR)):
                                c_flat[np.uint64((g * M + m0 + j) * N + p * MR + i)] = acc[np.uint64(((q * bpan + p) * NR + j) * MR + i)]
            return
        # several passes of SWAP_PANELS panels over the same rows of a (kept apart from the one-pass
        # loop: one loop nest for both made LLVM's code for the common case 25% slower)
        for task in prange(G * ablocks):
            g = task // ablocks
            m0 = (task - g * ablocks) * NR
            acc = carray(_lm_alloca(SWAP_ACC_ELEMS, np.float32), (SWAP_ACC_ELEMS,))
            for p0 in range(0, bpan, SWAP_PANELS):
                pn = min(SWAP_PANELS, bpan - p0)
                if K == 0:
                    for i in range(pn * NR * MR):
                        acc[i] = np.float32(0.0)
                for s in range(slices):
                    k0 = s * kc
                    kn = min(kc, K - k0)
                    if m0 + NR <= M:
                        src = a_flat
                        off = (g * M + m0) * K + k0
                    else:
                        src = ws
                        off = packed_b + g * NR * K + k0
                    for p in range(pn):
                        _lm_gemm_tile_fresh(ws, ((g * bpan + p0 + p) * K + k0) * MR, src, off, K, kn, acc[p * NR * MR:], MR, s == 0)
                for p in range(pn):
                    if m0 + NR <= M and (p0 + p + 1) * MR <= N:
                        _lm_store_tile(acc, p * NR * MR, c_flat, (g * M + m0) * N + (p0 + p) * MR, N)
                        continue
                    for j in range(min(NR, M - m0)):
                        for i in range(min(MR, N - (p0 + p) * MR)):
                            c_flat[np.uint64((g * M + m0 + j) * N + (p0 + p) * MR + i)] = acc[np.uint64((p * NR + j) * MR + i)]
        return
    SETUP_B
    prepack = chunks > 1 or kc > KC
    packed = G * panels * K * MR if prepack else 0
    if ws.size < packed + extra:
        raise ValueError("matmul: workspace smaller than workspace_elems")
    if prepack:
        for gp in prange(G * panels):
            _lm_pack_rows(a, gp // panels, gp % panels, ws, gp * K * MR)
    PREPARE_B
    for task in prange(G * chunks * panels):
        g = task // (chunks * panels)
        rest = task - g * chunks * panels
        ch = rest // panels
        p = rest - ch * panels
        first = ch * per_chunk
        count = min(blocks, first + per_chunk) - first
        rows = min(MR, M - p * MR)
        pk = carray(_lm_alloca(PK_ELEMS, np.float32), (PK_ELEMS,))     # on the stack: no
        acc = carray(_lm_alloca(ACC_ELEMS, np.float32), (ACC_ELEMS,))  # allocation per task
        if K == 0:   # (k empty: else the first slice starts every chain from +0.0)
            for i in range(count * NR * MR):
                acc[i] = np.float32(0.0)
        for s in range(slices):
            k0 = s * kc
            kn = min(kc, K - k0)
            if prepack:
                ap = ws
                a_off = ((g * panels + p) * K + k0) * MR
            else:
                for i in range(rows):
                    m = p * MR + i
                    for k in range(kn):
                        pk[k * MR + i] = a[g, m, k0 + k]
                for i in range(rows, MR):
                    for k in range(kn):
                        pk[k * MR + i] = np.float32(0.0)
                ap = pk
                a_off = 0
            for q in range(count):
                n0 = (first + q) * NR
                BLOCK_OF_B
                _lm_gemm_tile_fresh(ap, a_off, src, off, ld, kn, acc[q * NR * MR:], MR, s == 0)
        for q in range(count):
            n0 = (first + q) * NR
            if rows == MR and n0 + NR <= N:
                _lm_store_tile_t(acc, q * NR * MR, c_flat, (g * M + p * MR) * N + n0, N)
                continue
            for i in range(rows):
                for j in range(min(NR, N - n0)):
                    c_flat[np.uint64((g * M + p * MR + i) * N + n0 + j)] = acc[np.uint64((q * NR + j) * MR + i)]
'''

# How the tasks reach b's rows as f32 (SETUP_B: what ws holds past the packed a, `extra`;
# PREPARE_B once per call, BLOCK_OF_B per block of a task). f32: whole blocks in place; the
# last partial block (N not a multiple of NR) from a zero-padded copy in `ws` made once per call. f16, several panels and a workspace large
# enough: widened (exactly) once per call into `ws`, [G, blocks * NR, K] with zero rows past
# N, which every task reads; otherwise (one panel: decode) k is not sliced and each block's
# rows are widened into a small local buffer just before its tile reads them.
_B_SOURCES = {
    "f32": (
        "extra = G * NR * K if N % NR else 0",
        '''if N % NR:
        for g in range(G):
            _lm_pad_rows(b, g, (blocks - 1) * NR, ws, packed + g * NR * K)''',
        '''ld = K
                if n0 + NR <= N:
                    src = b_flat
                    off = (g * N + n0) * K + k0
                else:
                    src = ws
                    off = packed + g * NR * K + k0'''),
    "f16": (
        '''padded = blocks * NR
    wide = panels > 1 and ws.size >= (G * panels * K * MR if chunks > 1 else 0) + G * padded * K
    extra = G * padded * K if wide else 0
    if not wide:   # one slice: each block is widened once, whole rows (contiguous, vectorized)
        kc = K
        slices = 1''',
        '''if wide:
        for gn in prange(G * padded):
            g = gn // padded
            n = gn - g * padded
            for k in range(K):
                ws[packed + gn * K + k] = _lm_f16_from_bits(b[g, n, k]) if n < N else np.float32(0.0)''',
        '''if wide:
                    src = ws
                    off = packed + (g * padded + n0) * K + k0
                    ld = K
                else:
                    local = np.zeros(NR * K, np.float32)
                    for j in range(min(NR, N - n0)):
                        for k in range(K):
                            local[j * K + k] = _lm_f16_from_bits(b[g, n0 + j, k])
                    src = local
                    off = 0
                    ld = K'''),
}


def function_name(motif: str) -> str:
    return f"k_{motif}"


def render_module(motif: str = "matmul") -> str:
    """The generated numba module of one motif, written to the kernel cache like every kernel."""
    import numba

    from loomc.lower.numba_helpers import IMPORTS, helpers_for

    b_dtype, batched = MOTIFS[motif]
    tiles = [("_n", PANEL_ROWS, TILE_COLS, K_SLICE)] + ([("_w", *WIDE_TILE, WIDE_K_SLICE)] if WIDE_TILE else [])
    header = (f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.\n"
              f"# motif {motif}: c[g, m, n] = fma chain over k of a[g, m, k] * b[g, n, k] "
              f"({b_dtype} b{', batched' if batched else ''}; loomc/lower/matmul.py), tiles "
              + ", ".join(f"{mr} x {nr}" for _, mr, nr, _ in tiles) + "\n")
    constants = (f"UNROLL = {UNROLL}\nCHUNK_ELEMS = {CHUNK_ELEMS}\nTASKS = {TASKS}\nACC_BLOCKS = {ACC_BLOCKS}\n"
                 f"SWAP_N = {SWAP_N}\nSHORT_K = {SHORT_K}\nSWAP_GROUP = {SWAP_GROUP}\nSWAP_MIN_M = {PANEL_ROWS}\n"
                 f"SWAP_NEAR_M = {SWAP_NEAR_M}\n")
    bodies = []
    for suffix, mr, nr, kc in tiles:
        constants += f"MR{suffix} = {mr}\nNR{suffix} = {nr}\nKC{suffix} = {kc}\nSWAP_PANELS{suffix} = {-(-SWAP_N // mr)}\n"
        bodies.append(_tile_driver_source(motif, suffix, mr, nr, kc))
    entry = (_ENTRY if WIDE_TILE else _NARROW_ENTRY).replace("FUNCTION", function_name(motif)).replace("SWAPPED_TEST", SWAPPED_TEST)
    text = "".join(bodies) + entry
    helpers = "".join(h + "\n\n" for h in helpers_for(text))
    return header + IMPORTS + "\n" + constants + "\n" + helpers + text


# The motif's entry: picks the tile by the call's shape, as `tile_for` does.
_ENTRY = '''

@njit(cache=True)
def FUNCTION(a, b, c, ws):
    M, K = a.shape[1], a.shape[2]
    N = b.shape[1]
    p = N if SWAPPED_TEST else M
    if p >= MR_w and (p + MR_w - 1) // MR_w * MR_w * 10 <= (p + MR_n - 1) // MR_n * MR_n * 11:
        FUNCTION_w(a, b, c, ws)
    else:
        FUNCTION_n(a, b, c, ws)
'''

# Without the wide tile (AVX2, baseline), the entry is the narrow driver's.
_NARROW_ENTRY = '''

@njit(cache=True)
def FUNCTION(a, b, c, ws):
    FUNCTION_n(a, b, c, ws)
'''

# The names each tile's copy of the tile, copies and driver gets its suffix on
_PER_TILE_NAMES = re.compile(r"\b(MR|NR|KC|SWAP_PANELS|_lm_tile_codegen|_lm_gemm_tile|_lm_gemm_tile_rows|"
                             r"_lm_gemm_tile_fresh|_lm_store_codegen|_lm_store_tile|_lm_store_tile_t|"
                             r"_lm_pack_rows|_lm_pad_rows|_lm_pack_b)\b")


def _tile_driver_source(motif: str, suffix: str, mr: int, nr: int, kc: int) -> str:
    """The tile intrinsics, copies and driver of `motif` for one tile shape, every name of its
    own carrying `suffix` (the module holds one such set per tile)."""
    b_dtype = MOTIFS[motif][0]
    setup, prepare, block = _B_SOURCES[b_dtype]
    swap_panels = -(-SWAP_N // mr)
    driver = (_DRIVER.replace("FUNCTION", function_name(motif) + suffix).replace("SWAPPED_TEST", SWAPPED_TEST)
              .replace("SETUP_B", setup).replace("PREPARE_B", prepare)
              .replace("SWAP_GROUP_ACC_ELEMS", str(SWAP_GROUP * swap_panels * nr * mr))
              .replace("SWAP_ACC_ELEMS", str(swap_panels * nr * mr))
              .replace("BLOCK_OF_B", block).replace("PK_ELEMS", str(kc * mr))
              .replace("ACC_ELEMS", str(ACC_BLOCKS * nr * mr)))
    driver = driver.replace("NR * MR", str(mr * nr))
    copies = pack_source("_lm_pack_rows", "f32") + PAD_SOURCE
    copies += pack_source("_lm_pack_b", b_dtype) if b_dtype != "f32" else "\n_lm_pack_b = _lm_pack_rows\n"
    return _PER_TILE_NAMES.sub(lambda m: m.group(1) + suffix, TILE_SOURCE + copies + "\n" + driver)


def groups_rows_depth(shape) -> tuple[int, int, int]:
    """(groups, rows, depth) of a motif's `a`: [M, K] is one group, [G, M, K] G groups."""
    return (1, *shape) if len(shape) == 2 else tuple(shape)


def workspace_for(motif: str, dims: list[list[int]], scalars: list) -> int:
    """`workspace_elems` from the operands' dimensions (a, b, c), as a command dispatches them."""
    a_dims, b_dims, _ = dims
    return workspace_elems(motif, *groups_rows_depth(a_dims), b_dims[-2])


def launch_arguments(motif: str, values: list, workspace: np.ndarray) -> tuple:
    """The driver's arguments for a dispatch's operands (a, b, c with their group dimension in
    front; f16 b as its bits); ValueError when the shapes do not make c = a . b^T."""
    a, b, c = values
    g, m, k = groups_rows_depth(a.shape)
    n = b.shape[-2]
    if b.shape[-1] != k or b.shape[:-2] != a.shape[:-2] or c.shape != a.shape[:-2] + (m, n):
        raise ValueError(f"a {a.shape}, b {b.shape}, c {c.shape} do not make c = a . b^T")
    if b.dtype == np.float16:
        b = b.view(np.uint16)  # f16 weights reach the motif as their bits
    return a.reshape(g, m, k), b.reshape(g, n, k), c.reshape(g, m, n), workspace


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

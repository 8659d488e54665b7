"""Integer-dot matmuls over GGUF block-quantized weights on the cpu target.

    matmul_q4_1_i16(x: f32[T, K], w: q4_1[N, K], out y: f32[T, N])
    matmul_q8_0_i16(x: f32[T, K], w: q8_0[N, K], out y: f32[T, N])
    matmul_q4_1x16_i16(x: f32[T, K], w: q4_1x16[N, K], out y: f32[T, N])   (q4_1 blocks in 16-row panels)
    matmul_q8_0x16_i16(x: f32[T, K], w: q8_0x16[N, K], out y: f32[T, N])   (q8_0 blocks in 16-row panels)

y = x . w^T with the activations quantized to 16-bit integer codes first, then integer dot
products with the weights' own 4- or 8-bit codes (llama.cpp's `vec_dot_q4_1_q8_1` is the same
idea with 8-bit codes). Both contracts start alike:

* Each row of x, per block of 32, becomes 32 codes q = rint(x * (1 / d)) (ties to even,
  saturated to i16), with its scale d = max |x| / 32767 (an all-zero block: d = 0, codes 0)
  and, for q4_1, s = d * sum(q).

Plain rows (`matmul_q4_1_i16`, `matmul_q8_0_i16`): a vector lane per pair of elements.

* Per block b, the integer dot of the weight's codes with the activation's, exact in i32, in
  16 partial sums p[j] over elements 2j and 2j + 1 (the lanes `vpmaddwd` produces).
* acc[j] = fma(f32(p[j]), dw * dx, acc[j]) in block order from +0.0, one accumulator of 16
  lanes; for q4_1 also mins = fma(mw, s, mins) in block order from +0.0.
* y = the fold of acc (lanes 0..7 + 8..15, 0..3 + 4..7, 0..1 + 2..3, 0 + 1), + mins.

Panels (`matmul_q4_1x16_i16`, `matmul_q8_0x16_i16`; `q4_1x16`/`q8_0x16` in loomc/dtypes.py):
a vector lane per row of w.

* Per block b, the integer dot P of all 32 codes, exact in i32.
* acc = fma(f32(P), dw * dx, acc), then for q4_1 acc = fma(mw, s, acc), in block order from
  +0.0; y = acc. (f32(P) is exact for q4_1, |P| < 2^24; for q8_0 it rounds to nearest once.)

Every step is exact or one rounding in a fixed order, so the bits are the same on every SIMD
class and whatever T or the thread split: a row's output depends on that row alone (batch
invariance). Only the instructions differ: `vpmaddwd` (per block one on zmm, or two on ymm)
or VNNI's `vpdpwssd`, plain vector IR without AVX2. The two contracts round differently
(the panels' has fewer roundings), so the same blocks in rows and in panels do not give the
same bits.

Against the f32 kernels of std:quant.loom (which dequantize each weight and keep x in f32),
rounding x to codes moves each element by at most d / 2, 1/65534 of its block's largest:
over SmolLM2-135M 1-2e-4 of the logits' scale, and teacher-forced over 512 tokens the argmax
agrees with transformers everywhere, with either contract (tests/numerics/test_scout_reference.py).
8-bit codes, as llama.cpp uses, were measured at 4.5e-2 of the scale and 96 % agreement there.

How plain rows run: one pass quantizes every row of x into the workspace (codes, then scales,
then sums; on one thread up to PARALLEL_QUANTIZE_BLOCKS blocks; in plain vector IR, since x86
expands LLVM's `reduce.fmax` and saturating `fptosi` lane by lane, which made the pass about 1
us a row of 576: an 8-row 576 x 576 projection took 16.1 us with it, 13.4 us without; and
QUANTIZE_GROUP = 16 blocks of a row at a time, their largest |x| and code sums reduced across
the blocks together and the two divisions as one vector each, the same operations on the same
values: alone, a block's reductions and divisions were one chain, 8.8-10 ns a block, in groups
5.0-6.4 on the Zen 5 machine, an 8-row step's projections about 3 us a layer faster); then a
task per 4 rows of w runs all T rows of x against them in tiles (`tile_shape`: 4 x 4 with
AVX-512's 32 vector registers, else 2 x 2): each weight block is read from memory once per call
and unpacked once per tile, and each activation block's load serves a tile's rows of w. With
one row of x (decode) on Intel's AVX-512 cores, and always without AVX-512, each block runs as
two halves of 16 elements on ymm registers, whose accumulators are the contract's lanes 0..7
and 8..15: there the 512-bit form spends most of its time on the one port that shuffles 512-bit
vectors (joining the unpacked nibbles, broadcasting the scale), and the halves were 15-25 %
faster per core. AMD Zen 5 shuffles 512-bit vectors on more than one pipe, and there the
512-bit form was 5-20 % faster at T = 1 (docs/performance.md).

How panels run: the same quantizing pass, then a task per panel of 16 rows of w runs all T
rows of x against it in tiles of `panel_tokens()` rows (8 with AVX-512), then 4, 2, 1.
A panel's block is one span (q4_1: 320 bytes, five cache lines): its 16 scales, (q4_1) its 16
minimums, then its codes 2 bytes per row at a time, so one 32-byte load widened to 16-bit
codes holds elements 2c and 2c + 1 of every row, lane by lane. Each such vector meets a
broadcast of the same two activation codes: one `vpdpwssd` per 2 elements of 16 rows and a
row of x, with no fold, and the scales' conversion, product and fmas serve 16 rows at once.
The plain rows' tile spends a multiply, a conversion and an fma per (row of w, row of x,
block) besides the dot; against it the panels ran scout's projections 1.2-2.6x faster at
T = 8, 2.3-3.0x at T = 128 and 1.4-1.9x at T = 1 with the weights hot, and the LM head 2.65x
at T = 8 (bench/panels.py, the Zen 5 machine; docs/performance.md).

Plain rows ask for the cache line PREFETCH_BYTES ahead of the block each reads. Decode streams
each weight once per step from memory (scout's 96 MB against a 32 MB last-level cache on the
Zen 5 machine); there the hardware prefetchers alone kept a thread's stream at 7-8 GB/s, and
the hint made the q8_0 LM head 3-4x faster on cold weights. A panel asks for each line of its
span once, as non-temporal (prefetchnta): fetched as temporal, scout's 66 MB of 4-row panels
pushed out of the last-level cache what the step reads again (the KV pages), and the
non-temporal hint took a served step from 3.98-4.36 to 3.60-3.75 ms there. One row of x asks
PREFETCH_BYTES ahead; a tile of 2 or more rows, which computes longer on each block, asks
PANEL_ROWS_PREFETCH_BYTES (8 KB) ahead: scout's 8-row step's kernels, alternated against 16 KB
on the same weights from memory, took 2-2.4 % less time (AVX2 code, bound by its dot
instructions: the same); the same bits either way.

Panels without AVX-512 (AVX2's 16 ymm registers) run on 8-lane vectors, the panel's rows as
two halves of 8 (`_lm_panel_halves`), the float accumulators of a tile of several rows of x
in y, and each integer sum passed through an empty asm statement so that LLVM keeps the adds
in order instead of computing a unit's products for every row of x first and spilling them.
A tile is 4 rows of x, as before.
AVX2 code on the Zen 5 machine, same bits: scout's projections 1.3x faster at T = 8 and
1.05-1.1x at T = 1 (streamed), the q8_0 LM head 1.8x at T = 8 (docs/performance.md, eleventh
session).

`matmul_q4_1x16_i16_ahead(x, w, y, k_cache, rows, positions, page_table, layer)` is the q4_1
panel motif, the same bits, that also reads ahead the keys an attention_paged call of `layer`
will read for these tokens (`_lm_key_spans`: each row's pages up to its tokens' last
position): the 64-byte lines of those (page, layer) spans are spread over the panels' first
tiles, a few asked for (prefetcht0) in each block, where the projection computes and the
memory has room. A burst of them before the panels instead held the projection up as long as
the memory took to fetch them. At 8 rows, scout's gate/up projection reading the next layer's
keys took its attention from 47.6-53.4 to 33.5-36.0 us a call on the Zen 5 machine, the step
1-3 % faster; on AVX2 code 63.5-67.5 -> 44.4-46.3 us, the step 3.5 % (docs/performance.md,
twelfth session).
Below AHEAD_TOKENS rows of x nothing is read ahead: at 1 row the projection streams its own
weights, and the extra traffic made the served step 0.1 ms slower.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from loomc import LOOMC_VERSION
from loomc.dtypes import DTYPES
from loomc.ir.module import QUANT_BLOCK_BYTES, QUANT_BLOCK_ELEMS
from loomc.lower.attention import VECTOR_LOOP_SOURCE

# The motifs this module serves: name -> the weights' dtype.
MOTIFS = {"matmul_q4_1_i16": "q4_1", "matmul_q8_0_i16": "q8_0",
          "matmul_q4_1x16_i16": "q4_1x16", "matmul_q8_0x16_i16": "q8_0x16",
          "matmul_q4_1x16_i16_ahead": "q4_1x16"}
# Panel motifs that also read ahead, while they compute, the keys a later attention_paged call
# will read (their operands after y: k_cache, rows, positions, page_table, layer). Reading the
# values ahead as well (f16, in scout's down projection) measured no faster.
AHEAD = {"matmul_q4_1x16_i16_ahead"}
# Rows of x from which they do: with fewer the projection waits on its own weights' stream,
# and more memory traffic slowed it (1 row: the served step 0.1 ms slower)
AHEAD_TOKENS = 4
BLOCK = QUANT_BLOCK_ELEMS                   # elements per GGUF block, and per activation scale
BLOCK_BYTES = {dtype: QUANT_BLOCK_BYTES[dtype] for dtype in MOTIFS.values()}   # bytes per weight block
ROWS = 4                                    # rows of w per task: one activation load serves them
PANEL_ROWS = {dtype: DTYPES[dtype].panel_rows for dtype in MOTIFS.values()}   # rows per panel (0: plain rows)
# Panels have their own tiles, a vector lane per row of w: 16 rows, codes 2 bytes per row at a time
assert all(DTYPES[d].panel_unit == 2 and PANEL_ROWS[d] == 16 for d in MOTIFS.values() if PANEL_ROWS[d])
# Blocks of x (rows x K / 32) from which the quantizing pass runs in a parallel region of its
# own: below, one thread quantizes faster than a region starts (about 2 us with TBB; a block
# took about 8 ns). Measured on Zen 5 at K = 576 and 1536: serial won to 384 blocks, tied at 576
# (before blocks were quantized in groups, 5-6 ns a block: not measured again since).
PARALLEL_QUANTIZE_BLOCKS = 512
QUANTIZE_GROUP = 16                         # blocks the quantizing pass reduces together
assert QUANTIZE_GROUP == 16, "a group's blocks are the 16 lanes of one <16 x i32> vector (`across`)"
PREFETCH_BYTES = 16384                      # how far ahead of each row's block its cache line is asked for
# How far ahead a panel's tile of 2 or more rows of x asks for its lines: it computes long
# enough on each block for them to arrive from nearer. Scout's 120 projections on weights from
# memory: 2-4 % less time than at 16 KB with 8 and 4 rows of x (one row, which waits on the
# stream, was 7 % slower at 8 KB); its whole 8-row step's kernels 2-2.4 % (4 KB: 0.6 %).
PANEL_ROWS_PREFETCH_BYTES = 8192


def tile_shape() -> tuple[int, int]:
    """(rows of w, rows of x) per dot tile at T > 1: its accumulators must stay in vector
    registers. AVX-512: 4 x 4 accumulators of 16 lanes (16 of 32 zmm); else 2 x 2 pairs of 8
    lanes (8 of 16 ymm)."""
    from loomc.lower.matmul import _target_has_avx512

    return (4, 4) if _target_has_avx512() else (2, 2)


def panel_tokens() -> int:
    """Rows of x per tile of a panel. AVX-512: one <16 x i32> integer and one <16 x f32>
    accumulator each stay in registers (8 pairs of 32 zmm). Else 4: the tile runs the panel's
    rows as two halves of 8 (`_lm_panel_halves`), two <8 x i32> sums per row of x in registers
    (8 of AVX2's 16 ymm) and the float accumulators in y. (8 rows of x, each half in its own
    pass, were as fast for q4_1 and 7 % slower for q8_0's LM head.)"""
    from loomc.lower.matmul import _target_has_avx512

    return 8 if _target_has_avx512() else 4


def workspace_elems(rows: int, depth: int) -> int:
    """f32 elements of the workspace: rows x depth 16-bit codes, then a scale and a sum per block."""
    return rows * depth // 2 + 2 * rows * (depth // BLOCK)


# The drivers: quantize every row of x into the workspace, then a task per group of rows of w
_QUANTIZE = '''
@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")
def FUNCTION(x, w, y, ws):
    T = x.shape[0]
    K = x.shape[1]
    N = y.shape[1]
    B = K // 32
    rb = w.shape[1]
    codes = T * B * 16
    sums = codes + T * B
    if T * B >= PARALLEL_QUANTIZE_BLOCKS:
        for t in prange(T):
            _lm_quantize_rows(x, t * K, B, ws, t * K, codes + t, sums + t, T)
    else:
        for t in range(T):
            _lm_quantize_rows(x, t * K, B, ws, t * K, codes + t, sums + t, T)
'''

_DRIVER = _QUANTIZE + '''    groups = (N + ROWS - 1) // ROWS
    for g in prange(groups):
        n = g * ROWS
        t = 0
        while t < T:
            span = TOKENS if t + TOKENS <= T else 1
            q, d, s = t * K, codes + t, sums + t
            if n + ROWS <= N and span == TOKENS:
                for sub in range(0, ROWS, TILE_ROWS):
                    _lm_dot_tile(w, (n + sub) * rb, rb, ws, q, d, s, B, K, T, y, t * N + n + sub, N)
            elif n + ROWS <= N:
                _lm_dot_rows(w, n * rb, rb, ws, q, d, s, B, K, T, y, t * N + n, N)
            else:
                for r in range(n, N):
                    if span == TOKENS:
                        _lm_dot_tokens(w, r * rb, rb, ws, q, d, s, B, K, T, y, t * N + r, N)
                    else:
                        _lm_dot_one(w, r * rb, rb, ws, q, d, s, B, K, T, y, t * N + r, N)
            t += span
'''

_PANEL_LOOP = '''    panels = N // PANEL
    per = (lines + panels - 1) // panels if panels else 0   # lines read ahead per panel, in its first tile
    pb = (per + B - 1) // B if B else 0                     # and per block of it
    for g in prange(panels):
        at, t = g * PANEL, 0
        first, end = g * per, min(lines, g * per + per)
        while t < T:
            q, d, s, out = t * K, codes + t, sums + t, t * N + at
            if t + TOKENS <= T:
                _lm_panel_tile(w, at * rb, ws, q, d, s, B, K, T, y, out, N, aux, starts, lps, first, end, pb)
                t += TOKENS
            elif t + 4 <= T:
                _lm_panel_4(w, at * rb, ws, q, d, s, B, K, T, y, out, N, aux, starts, lps, first, end, pb)
                t += 4
            elif t + 2 <= T:
                _lm_panel_2(w, at * rb, ws, q, d, s, B, K, T, y, out, N, aux, starts, lps, first, end, pb)
                t += 2
            else:
                _lm_panel_1(w, at * rb, ws, q, d, s, B, K, T, y, out, N, aux, starts, lps, first, end, pb)
                t += 1
            first = end   # later tiles of the panel read nothing ahead
'''

_PANEL_DRIVER = _QUANTIZE + '''    aux, starts, lps, lines = w, NO_SPANS, 1, 0   # nothing to read ahead
''' + _PANEL_LOOP + '''

NO_SPANS = np.empty(0, np.int64)
'''

# The read-ahead panel driver: the byte offsets in k_cache of the (page, layer) key spans
# attention_paged will read for these tokens (each row's pages up to its tokens' last
# position, pages with a valid id, a layer inside the cache), their 64-byte lines spread over
# the panels' first tiles, a few per block
_PANEL_AHEAD_DRIVER = _QUANTIZE.replace("(x, w, y, ws)", "(x, w, y, ws, k_cache, rows, positions, page_table, layer)") + '''    starts, lps = _lm_key_spans(k_cache, rows, positions, page_table, layer if T >= AHEAD_TOKENS else -1)
    aux, lines = k_cache.reshape(-1), starts.size * lps
''' + _PANEL_LOOP + '''

@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_key_spans(k_cache, rows, positions, page_table, layer):
    C, L, S, KD = k_cache.shape
    R, P = page_table.shape
    top = np.full(R, -1, np.int64)
    for t in range(rows.size):
        r = rows[t]
        if r >= 0 and r < R and positions[t] >= 0:
            top[r] = max(top[r], positions[t])
    starts = np.empty(R * P if layer >= 0 and layer < L else 0, np.int64)
    n = 0
    for r in range(R if starts.size else 0):
        for pi in range(min(P, (top[r] + S) // S)):
            page = page_table[r, pi]
            if page >= 0 and page < C:
                starts[n] = (page * L + layer) * S * KD * 4
                n += 1
    return starts[:n], (S * KD * 4 + 63) // 64
'''

# Helpers of the LLVM IR intrinsics of generated modules (this one's and loomc/lower/i8gemm.py's):
# which instructions the target has, declaring an LLVM function, a typed pointer into an array.
IR_HELPERS_SOURCE = '''
def _lm_target_has(feature):
    # whether numba generates code for a CPU with `feature`: NUMBA_CPU_FEATURES when a
    # machine class is emulated, else the host's
    import llvmlite.binding as ll
    from numba.core import config

    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else ""
    if "+" + feature in features.split(","):
        return True
    if "-" + feature in features.split(",") or (config.CPU_NAME or "host").lower() != "host":
        return False
    return bool(ll.get_host_cpu_features().get(feature, False))


def _lm_target_cpu():
    # the LLVM name of the CPU numba generates code for ("znver5", "sapphirerapids", ...):
    # NUMBA_CPU_NAME when a machine class is emulated, else the host's
    import llvmlite.binding as ll
    from numba.core import config

    name = (config.CPU_NAME or "host").lower()
    return ll.get_host_cpu_name().lower() if name == "host" else name


def _lm_fast_wide_shuffles():
    # whether 512-bit shuffles and broadcasts issue on more than one port: AMD Zen 5 and later
    # (full-width 512-bit pipes), not Intel's AVX-512 cores (port 5 only) nor Zen 4 (256-bit
    # halves)
    import re

    match = re.fullmatch(r"znver(\\d+)", _lm_target_cpu())
    return match is not None and int(match.group(1)) >= 5


def _lm_prefetch(builder, pointer, distance, locality=3):
    # a hint to fetch the cache line `distance` bytes past byte pointer `pointer`: into every
    # level (locality 3: prefetcht0), or as non-temporal (0: prefetchnta); never faults,
    # changes no value
    from llvmlite import ir as llir

    i32 = llir.IntType(32)
    fetch = _lm_ir_function(builder, "llvm.prefetch.p0", llir.VoidType(), [pointer.type, i32, i32, i32])
    ahead = builder.gep(pointer, [llir.Constant(llir.IntType(64), distance)])
    builder.call(fetch, [ahead, llir.Constant(i32, 0), llir.Constant(i32, locality), llir.Constant(i32, 1)])


def _lm_arguments(context, builder, sig, args):
    # an intrinsic's arguments as LLVM values: integers widened to i64, arrays and floats as given
    return [context.cast(builder, a, t, types.int64) if isinstance(t, types.Integer) else a
            for a, t in zip(args, sig.args)]


def _lm_ir_function(builder, name, result, params):
    from llvmlite import ir as llir

    return cgutils.get_or_insert_function(builder.module, llir.FunctionType(result, params), name)


def _lm_pointer(context, builder, array_type, array, offset, element):
    # pointer of LLVM type `element`* to element `offset` of a C-contiguous array's data
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), element.as_pointer())

'''

# The intrinsics both tile kinds use (the pair dot, f16 fields, quantizing x), as LLVM IR
# through llvmlite: the target's dot instruction is chosen when numba compiles them, from the
# CPU it compiles for (numba keys its cache on that CPU).
_INTRINSICS = IR_HELPERS_SOURCE + '''
def _lm_dot16(builder, w, x):
    # <16 x i32>: lane j = w[2j] x[2j] + w[2j + 1] x[2j + 1] over two <32 x i16> blocks of codes,
    # exact (|w| <= 128, |x| <= 32767): one vpmaddwd on AVX-512, two with AVX2 (lanes 0..7 from
    # the first 16 elements, 8..15 from the second), else plain IR. (VNNI's vpdpwssd adds the
    # products to an accumulator; each block has its own scale, so there is nothing to add to,
    # and with a zeroed accumulator it is one instruction more.)
    from llvmlite import ir as llir

    i16, i32 = llir.IntType(16), llir.IntType(32)
    v8i, v16i, v16s, v32s = (llir.VectorType(i32, 8), llir.VectorType(i32, 16), llir.VectorType(i16, 16),
                             llir.VectorType(i16, 32))
    if _lm_target_has("avx512bw"):
        madd = _lm_ir_function(builder, "llvm.x86.avx512.pmaddw.d.512", v16i, [v32s, v32s])
        return builder.call(madd, [w, x])
    if _lm_target_has("avx2"):
        madd = _lm_ir_function(builder, "llvm.x86.avx2.pmadd.wd", v8i, [v16s, v16s])
        halves = []
        for h in range(2):
            pick = llir.Constant(llir.VectorType(i32, 16), list(range(16 * h, 16 * h + 16)))
            halves.append(builder.call(madd, [builder.shuffle_vector(w, w, pick), builder.shuffle_vector(x, x, pick)]))
        return builder.shuffle_vector(halves[0], halves[1], llir.Constant(v16i, list(range(16))))
    v32i = llir.VectorType(i32, 32)
    products = builder.mul(builder.sext(w, v32i), builder.sext(x, v32i))
    even = builder.shuffle_vector(products, products, llir.Constant(v16i, [2 * j for j in range(16)]))
    odd = builder.shuffle_vector(products, products, llir.Constant(v16i, [2 * j + 1 for j in range(16)]))
    return builder.add(even, odd)


def _lm_half(builder, at):
    # the little-endian f16 at byte pointer `at`, exactly as f32 (fpext: vcvtph2ps with F16C;
    # else its bits shifted into an f32 and rescaled by 2^112, exact for every finite half)
    from llvmlite import ir as llir

    f32, i16, i32 = llir.FloatType(), llir.IntType(16), llir.IntType(32)
    if _lm_target_has("f16c"):
        return builder.fpext(builder.load(builder.bitcast(at, llir.HalfType().as_pointer()), align=1), f32)
    bits = builder.zext(builder.load(builder.bitcast(at, i16.as_pointer()), align=1), i32)
    body = builder.bitcast(builder.shl(builder.and_(bits, llir.Constant(i32, 0x7FFF)), llir.Constant(i32, 13)), f32)
    value = builder.fmul(body, llir.Constant(f32, 2.0 ** 112))
    sign = builder.shl(builder.and_(bits, llir.Constant(i32, 0x8000)), llir.Constant(i32, 16))
    return builder.bitcast(builder.or_(builder.bitcast(value, i32), sign), f32)


def _lm_dot8(builder, w, x):
    # <8 x i32>: lane j = w[2j] x[2j] + w[2j + 1] x[2j + 1] over <16 x i16> half blocks, exact:
    # one vpmaddwd on ymm with AVX2 (no cross-lane shuffle to join halves), else plain IR
    from llvmlite import ir as llir

    i16, i32 = llir.IntType(16), llir.IntType(32)
    v8i, v16s = llir.VectorType(i32, 8), llir.VectorType(i16, 16)
    if _lm_target_has("avx2"):
        return builder.call(_lm_ir_function(builder, "llvm.x86.avx2.pmadd.wd", v8i, [v16s, v16s]), [w, x])
    v16i = llir.VectorType(i32, 16)
    products = builder.mul(builder.sext(w, v16i), builder.sext(x, v16i))
    even = builder.shuffle_vector(products, products, llir.Constant(v8i, [2 * j for j in range(8)]))
    odd = builder.shuffle_vector(products, products, llir.Constant(v8i, [2 * j + 1 for j in range(8)]))
    return builder.add(even, odd)


def _lm_halves(builder, at, count):
    # the `count` (1 or 2) little-endian f16 values from byte pointer `at`, exactly as f32: one
    # vcvtph2ps with F16C, else each by _lm_half's integer path
    from llvmlite import ir as llir

    if not _lm_target_has("f16c"):
        return [_lm_half(builder, builder.gep(at, [llir.Constant(llir.IntType(64), 2 * i)])) for i in range(count)]
    if count == 1:
        return [_lm_half(builder, at)]
    pair = llir.VectorType(llir.HalfType(), 2)
    wide = builder.fpext(builder.load(builder.bitcast(at, pair.as_pointer()), align=1), llir.VectorType(llir.FloatType(), 2))
    return [builder.extract_element(wide, llir.Constant(llir.IntType(32), i)) for i in range(count)]


def _lm_umax(builder, a, b):
    # lane-wise unsigned maximum of two integer vectors (vpmaxud)
    return builder.select(builder.icmp_unsigned(">", a, b), a, b)


def _lm_quantize_codegen(context, builder, sig, args):
    # _lm_quantize_rows(x, x_off, blocks, ws, q_off, d_off, s_off, stride): per block b of 32
    # floats of x from x_off, its 16-bit codes (from element q_off of ws as i16), its scale and
    # scaled code sum (floats d_off + b * stride, s_off + b * stride: a block's rows side by side)
    from llvmlite import ir as llir

    f32, i16, i32, i64 = llir.FloatType(), llir.IntType(16), llir.IntType(32), llir.IntType(64)
    v32f, v32s, v32i = llir.VectorType(f32, 32), llir.VectorType(i16, 32), llir.VectorType(i32, 32)
    x, x_off, blocks, ws, q_off, d_off, s_off, stride = _lm_arguments(context, builder, sig, args)
    xs = _lm_pointer(context, builder, sig.args[0], x, x_off, f32)
    codes = builder.gep(_lm_pointer(context, builder, sig.args[3], ws, llir.Constant(i64, 0), i16), [q_off])
    scales = _lm_pointer(context, builder, sig.args[3], ws, d_off, f32)
    sums = _lm_pointer(context, builder, sig.args[3], ws, s_off, f32)
    v16f, v16i = llir.VectorType(f32, 16), llir.VectorType(i32, 16)
    fabs = _lm_ir_function(builder, "llvm.fabs.v32f32", v32f, [v32f])
    rint = _lm_ir_function(builder, "llvm.rint.v32f32", v32f, [v32f])
    total = _lm_ir_function(builder, "llvm.vector.reduce.add.v32i32", i32, [v32i])

    def top(a):
        # the largest lane of |x| ignoring NaN (NaN only if every lane is), as
        # llvm.vector.reduce.fmax defines it. Lanes hold |x| >= +0, whose bits order as
        # integers as the values do (infinity included), so a NaN lane becomes 0 and a
        # butterfly of integer maxima finds the largest: exact, one cycle a step. (x86
        # expands reduce.fmax without fast-math flags lane by lane; vector maxnum costs a
        # compare and a blend on top of each maximum.)
        bits = builder.bitcast(a, v32i)
        nan = builder.fcmp_unordered("uno", a, a)
        bits = builder.select(nan, llir.Constant(v32i, [0] * 32), bits)
        m = _lm_umax(builder, builder.shuffle_vector(bits, bits, llir.Constant(v16i, list(range(16)))),
                     builder.shuffle_vector(bits, bits, llir.Constant(v16i, list(range(16, 32)))))
        for step in (8, 4, 2, 1):
            m = _lm_umax(builder, m, builder.shuffle_vector(m, m, llir.Constant(v16i, [i ^ step for i in range(16)])))
        largest = builder.bitcast(builder.extract_element(m, llir.Constant(i32, 0)), f32)
        every_nan = builder.icmp_unsigned("==", builder.bitcast(nan, i32), llir.Constant(i32, -1))
        # every lane NaN: the last lane's (its payload, as the maxnum butterfly gave it)
        return builder.select(every_nan, builder.extract_element(a, llir.Constant(i32, 31)), largest)

    def narrow(r):
        # llvm.fptosi.sat to i16 (NaN -> 0, beyond the range -> its bound) as plain vector
        # compares and one conversion: x86 expands the saturating form lane by lane. Also the
        # codes as i32 (already in i16's range: their sum needs no sign extension)
        bound = [llir.Constant(v32f, [value] * 32) for value in (-32768.0, 32767.0)]
        r = builder.select(builder.fcmp_ordered("ord", r, r), r, llir.Constant(v32f, [0.0] * 32))
        r = builder.select(builder.fcmp_ordered("<", r, bound[0]), bound[0], r)
        r = builder.select(builder.fcmp_ordered(">", r, bound[1]), bound[1], r)
        wide = builder.fptosi(r, v32i)
        return builder.trunc(wide, v32s), wide

    def one(b):
        v = builder.load(builder.bitcast(builder.gep(xs, [builder.mul(b, llir.Constant(i64, 32))]), v32f.as_pointer()),
                         align=4)
        d = builder.fdiv(top(builder.call(fabs, [v])), llir.Constant(f32, 32767.0))
        inv = builder.select(builder.fcmp_unordered("!=", d, llir.Constant(f32, 0.0)),
                             builder.fdiv(llir.Constant(f32, 1.0), d), llir.Constant(f32, 0.0))
        splat = builder.shuffle_vector(builder.insert_element(llir.Constant(v32f, None), inv, llir.Constant(i32, 0)),
                                       llir.Constant(v32f, None), llir.Constant(v32i, [0] * 32))
        q, wide = narrow(builder.call(rint, [builder.fmul(v, splat)]))
        builder.store(q, builder.bitcast(builder.gep(codes, [builder.mul(b, llir.Constant(i64, 32))]), v32s.as_pointer()),
                      align=2)
        builder.store(d, builder.gep(scales, [builder.mul(b, stride)]), align=4)
        s = builder.sitofp(builder.call(total, [wide]), f32)
        builder.store(builder.fmul(d, s), builder.gep(sums, [builder.mul(b, stride)]), align=4)

    def across(vectors, op):
        # 16 <16 x i32> vectors -> one whose lane k is op over vector k's lanes (exact for an
        # integer maximum or sum, in any order): pairs of vectors trade halves, 4 levels
        width = 16
        while len(vectors) > 1:
            lo = [i * width + j for i in range(32 // width) for j in range(width // 2)]
            hi = [i * width + width // 2 + j for i in range(32 // width) for j in range(width // 2)]
            vectors = [op(builder.shuffle_vector(a, b, llir.Constant(v16i, lo)),
                          builder.shuffle_vector(a, b, llir.Constant(v16i, hi)))
                       for a, b in zip(vectors[0::2], vectors[1::2])]
            width //= 2
        return vectors[0]

    def group(g):
        # blocks 16g .. 16g + 15 at once: one()'s operations on the same values, each block's
        # largest |x| and code sum reduced across the 16 blocks together and its two divisions
        # as one vector each (one() alone was a chain of reductions and divisions, 8.8 ns a
        # block). A group with an all-NaN block takes one() block by block.
        first = builder.mul(g, llir.Constant(i64, GROUP))

        def load(k):
            at = builder.mul(builder.add(first, llir.Constant(i64, k)), llir.Constant(i64, 32))
            return builder.load(builder.bitcast(builder.gep(xs, [at]), v32f.as_pointer()), align=4)

        tops, every_nan = [], llir.Constant(llir.IntType(1), 0)
        for k in range(GROUP):
            a = builder.call(fabs, [load(k)])
            nan = builder.fcmp_unordered("uno", a, a)
            bits = builder.select(nan, llir.Constant(v32i, [0] * 32), builder.bitcast(a, v32i))
            tops.append(_lm_umax(builder, builder.shuffle_vector(bits, bits, llir.Constant(v16i, list(range(16)))),
                                 builder.shuffle_vector(bits, bits, llir.Constant(v16i, list(range(16, 32))))))
            every_nan = builder.or_(every_nan, builder.icmp_unsigned("==", builder.bitcast(nan, i32),
                                                                     llir.Constant(i32, -1)))
        with builder.if_else(every_nan) as (alone, together):
            with alone:
                _lm_vector_loop(builder, llir.Constant(i64, GROUP), [llir.Constant(i64, 0)],
                                lambda k, values: (one(builder.add(first, k)), values)[1])
            with together:
                top = builder.bitcast(across(tops, lambda a, b: _lm_umax(builder, a, b)), v16f)
                d = builder.fdiv(top, llir.Constant(v16f, [32767.0] * 16))
                inv = builder.select(builder.fcmp_unordered("!=", d, llir.Constant(v16f, [0.0] * 16)),
                                     builder.fdiv(llir.Constant(v16f, [1.0] * 16), d), llir.Constant(v16f, [0.0] * 16))
                totals = []
                for k in range(GROUP):
                    b = builder.add(first, llir.Constant(i64, k))
                    splat = builder.shuffle_vector(inv, inv, llir.Constant(v32i, [k] * 32))
                    q, wide = narrow(builder.call(rint, [builder.fmul(load(k), splat)]))
                    builder.store(q, builder.bitcast(builder.gep(codes, [builder.mul(b, llir.Constant(i64, 32))]),
                                                     v32s.as_pointer()), align=2)
                    totals.append(builder.add(builder.shuffle_vector(wide, wide, llir.Constant(v16i, list(range(16)))),
                                              builder.shuffle_vector(wide, wide, llir.Constant(v16i, list(range(16, 32))))))
                sums_v = builder.fmul(d, builder.sitofp(across(totals, builder.add), v16f))
                at = builder.mul(first, stride)
                for k in range(GROUP):
                    builder.store(builder.extract_element(d, llir.Constant(i32, k)), builder.gep(scales, [at]), align=4)
                    builder.store(builder.extract_element(sums_v, llir.Constant(i32, k)), builder.gep(sums, [at]), align=4)
                    at = builder.add(at, stride)

    groups = builder.sdiv(blocks, llir.Constant(i64, GROUP))
    _lm_vector_loop(builder, groups, [llir.Constant(i64, 0)], lambda g, values: (group(g), values)[1])
    done = builder.mul(groups, llir.Constant(i64, GROUP))
    _lm_vector_loop(builder, builder.sub(blocks, done), [llir.Constant(i64, 0)],
                    lambda b, values: (one(builder.add(done, b)), values)[1])
    return context.get_dummy_value()


@intrinsic
def _lm_quantize_rows(typingctx, x, x_off, blocks, ws, q_off, d_off, s_off, stride):
    return types.none(x, x_off, blocks, ws, q_off, d_off, s_off, stride), _lm_quantize_codegen
'''

# The plain rows' tiles: a vector lane per pair of elements, folded at the end.
_ROW_INTRINSICS = '''
def _lm_dot_codegen(rows, tokens):
    def codegen(context, builder, sig, args):
        # (w, w_off, rb, ws, q_off, d_off, s_off, blocks, depth, stride, y, y_off, width):
        # y[y_off + u * width + r] for the `rows` rows of w from byte w_off (rb bytes apart)
        # against the `tokens` quantized rows of x from q_off (depth codes apart) and d_off /
        # s_off (side by side; block b's at b * stride): the scales of a block's `tokens` rows
        # are one vector, and so are the q4_1 minimum sums of a row of w
        from llvmlite import ir as llir

        f32, i8, i16, i32, i64 = (llir.FloatType(), llir.IntType(8), llir.IntType(16), llir.IntType(32),
                                  llir.IntType(64))
        v16f, v16i, v16b, v32b, v32s = (llir.VectorType(f32, 16), llir.VectorType(i32, 16), llir.VectorType(i8, 16),
                                        llir.VectorType(i8, 32), llir.VectorType(i16, 32))
        (w, w_off, rb, ws, q_off, d_off, s_off, blocks, depth, stride, y, y_off,
         width) = _lm_arguments(context, builder, sig, args)
        weights = _lm_pointer(context, builder, sig.args[0], w, w_off, i8)
        all_codes = _lm_pointer(context, builder, sig.args[3], ws, llir.Constant(i64, 0), i16)
        codes = [builder.gep(all_codes, [builder.add(q_off, builder.mul(depth, llir.Constant(i64, u)))])
                 for u in range(tokens)]
        vt = llir.VectorType(f32, tokens)
        scales = _lm_pointer(context, builder, sig.args[3], ws, d_off, f32)
        sums = _lm_pointer(context, builder, sig.args[3], ws, s_off, f32)
        out = _lm_pointer(context, builder, sig.args[10], y, y_off, f32)
        fma16 = _lm_ir_function(builder, "llvm.fma.v16f32", v16f, [v16f, v16f, v16f])
        v8f, v16s = llir.VectorType(f32, 8), llir.VectorType(i16, 16)
        fma8 = _lm_ir_function(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
        fma1 = _lm_ir_function(builder, "llvm.fma.f32", f32, [f32, f32, f32])
        fmat = _lm_ir_function(builder, "llvm.fma.v%df32" % tokens, vt, [vt, vt, vt])

        def spread(v, lane, width):   # <width x f32> of lane `lane` of vector v
            return builder.shuffle_vector(v, llir.Constant(v.type, None),
                                          llir.Constant(llir.VectorType(i32, width), [lane] * width))

        def splat(value, width):
            return spread(builder.insert_element(llir.Constant(llir.VectorType(f32, width), None), value,
                                                 llir.Constant(i32, 0)), 0, width)
        block_bytes = llir.Constant(i64, BLOCK_BYTES)
        row_starts = [builder.gep(weights, [builder.mul(rb, llir.Constant(i64, r))]) for r in range(rows)]
        pairs = rows * tokens   # accumulators in order r * tokens + u; then a vector of minimum sums per r

        def block_scales(b, vector):
            # block b's activation scales and q4_1 sums: the tile's rows of x as one vector, or
            # one row's as scalars
            at_b = builder.mul(b, stride)
            if not vector:
                return (builder.load(builder.gep(scales, [at_b]), align=4),
                        builder.load(builder.gep(sums, [at_b]), align=4) if Q4 else None)
            return (builder.load(builder.bitcast(builder.gep(scales, [at_b]), vt.as_pointer()), align=4),
                    builder.load(builder.bitcast(builder.gep(sums, [at_b]), vt.as_pointer()), align=4) if Q4 else None)

        def weight_block(r, b):
            # (byte pointer to the codes of block b of the tile's row r of w, its scale and q4_1
            # minimum as f32)
            at = builder.gep(row_starts[r], [builder.mul(b, block_bytes)])
            _lm_prefetch(builder, at, PREFETCH_BYTES)
            return builder.gep(at, [llir.Constant(i64, CODES_OFFSET)]), _lm_halves(builder, at, 2 if Q4 else 1)

        def half_block(b, values):
            # each block as two halves of 16 elements in <8 x f32> accumulators (lanes 0..7 and
            # 8..15 of the contract's 16), two per (r, u) in order (r * tokens + u) * 2 + h: on
            # AVX-512 this keeps the unpacking and the scale's broadcast off the one port that
            # shuffles 512-bit vectors; on AVX2 it is the registers' own width
            accs, mins = values[:2 * pairs], values[2 * pairs:]
            xq = [[builder.load(builder.bitcast(builder.gep(codes[u], [builder.add(builder.mul(b, llir.Constant(i64, 32)),
                                                                                   llir.Constant(i64, 16 * h))]),
                                                v16s.as_pointer()), align=2) for h in range(2)] for u in range(tokens)]
            dx, sx = block_scales(b, tokens > 1)
            new_accs, new_mins = [], []
            for r in range(rows):
                at, halves = weight_block(r, b)
                if Q4:
                    raw = builder.load(builder.bitcast(at, v16b.as_pointer()), align=1)
                    wide = builder.zext(raw, v16s)
                    wq = [builder.and_(wide, llir.Constant(v16s, [15] * 16)),
                          builder.lshr(wide, llir.Constant(v16s, [4] * 16))]
                else:
                    wq = [builder.sext(builder.load(builder.bitcast(builder.gep(at, [llir.Constant(i64, 16 * h)]),
                                                                    v16b.as_pointer()), align=1), v16s)
                          for h in range(2)]
                if tokens == 1:
                    row_scales = [splat(builder.fmul(halves[0], dx), 8)]
                else:
                    products = builder.fmul(splat(halves[0], tokens), dx)   # dw * dx of each row of x
                    row_scales = [spread(products, u, 8) for u in range(tokens)]
                for u in range(tokens):
                    for h in range(2):
                        p = _lm_dot8(builder, wq[h], xq[u][h])
                        new_accs.append(builder.call(fma8, [builder.sitofp(p, v8f), row_scales[u],
                                                            accs[(r * tokens + u) * 2 + h]]))
                if Q4 and tokens == 1:
                    new_mins.append(builder.call(fma1, [halves[1], sx, mins[r]]))
                elif Q4:
                    new_mins.append(builder.call(fmat, [splat(halves[1], tokens), sx, mins[r]]))
            return new_accs + new_mins

        def block(b, values):
            accs, mins = values[:pairs], values[pairs:]
            xs = [builder.load(builder.bitcast(builder.gep(codes[u], [builder.mul(b, llir.Constant(i64, 32))]),
                                               v32s.as_pointer()), align=2) for u in range(tokens)]
            sx = block_scales(b, True)[1]
            new_accs, new_mins = [], []
            # dw * dx of each (row of w, row of x) as 16 lanes: dx broadcast from memory (a load,
            # not a shuffle) once per row of x, dw once per row of w, one multiply per pair. A
            # 4-lane product spread to 16 lanes per pair queued on the shuffle port (the q8_0 LM
            # head ran 1.2x slower at T = 8 on Zen 5); the same products, so the same bits
            at_b = builder.mul(b, stride)
            dx16 = [splat(builder.load(builder.gep(scales, [builder.add(at_b, llir.Constant(i64, u))]), align=4), 16)
                    for u in range(tokens)]
            for r in range(rows):
                at, halves = weight_block(r, b)
                dw = splat(halves[0], 16)
                if Q4:
                    raw = builder.load(builder.bitcast(at, v16b.as_pointer()), align=1)
                    # the 16 bytes twice (a broadcast load), widened once; then the low nibbles
                    # in elements 0..15, the high in 16..31 (one shuffle per block, not two)
                    twice = builder.zext(builder.shuffle_vector(raw, raw, llir.Constant(llir.VectorType(i32, 32),
                                                                                        list(range(16)) * 2)), v32s)
                    wq = builder.and_(builder.lshr(twice, llir.Constant(v32s, [0] * 16 + [4] * 16)),
                                      llir.Constant(v32s, [15] * 32))
                else:
                    wq = builder.sext(builder.load(builder.bitcast(at, v32b.as_pointer()), align=1), v32s)
                for u, xq in enumerate(xs):
                    p = _lm_dot16(builder, wq, xq)
                    new_accs.append(builder.call(fma16, [builder.sitofp(p, v16f), builder.fmul(dw, dx16[u]),
                                                         accs[r * tokens + u]]))
                if Q4:
                    new_mins.append(builder.call(fmat, [splat(halves[1], tokens), sx, mins[r]]))
            return new_accs + new_mins

        zero16, zeros = llir.Constant(v16f, [0.0] * 16), llir.Constant(vt, [0.0] * tokens)
        split = _lm_target_has("avx2") and (not _lm_target_has("avx512bw")
                                            or (tokens == 1 and not _lm_fast_wide_shuffles()))
        # the minimum sums: one per row of w (a scalar at T = 1, else a vector over rows of x)
        if split:
            minimum = llir.Constant(f32, 0.0) if tokens == 1 else zeros
            minimums = [minimum] * (rows if Q4 else 0)
            values = _lm_vector_loop(builder, blocks, [llir.Constant(v8f, [0.0] * 8)] * (2 * pairs) + minimums,
                                     half_block)
            values = [builder.fadd(values[2 * i], values[2 * i + 1]) for i in range(pairs)] + [
                builder.insert_element(zeros, m, llir.Constant(i32, 0)) if tokens == 1 else m
                for m in values[2 * pairs:]]
        else:
            minimums = [zeros] * (rows if Q4 else 0)
            values = _lm_vector_loop(builder, blocks, [zero16] * pairs + minimums, block)
        for r in range(rows):
            for u in range(tokens):
                v = values[r * tokens + u]
                if not split:   # lanes 0..7 + 8..15 (the split form added its halves already)
                    v = builder.fadd(builder.shuffle_vector(v, v, llir.Constant(llir.VectorType(i32, 8), list(range(8)))),
                                     builder.shuffle_vector(v, v, llir.Constant(llir.VectorType(i32, 8),
                                                                                list(range(8, 16)))))
                v = builder.fadd(builder.shuffle_vector(v, v, llir.Constant(llir.VectorType(i32, 4), [0, 1, 2, 3])),
                                 builder.shuffle_vector(v, v, llir.Constant(llir.VectorType(i32, 4), [4, 5, 6, 7])))
                v = builder.fadd(builder.shuffle_vector(v, v, llir.Constant(llir.VectorType(i32, 2), [0, 1])),
                                 builder.shuffle_vector(v, v, llir.Constant(llir.VectorType(i32, 2), [2, 3])))
                s = builder.fadd(builder.extract_element(v, llir.Constant(i32, 0)),
                                 builder.extract_element(v, llir.Constant(i32, 1)))
                if Q4:
                    s = builder.fadd(s, builder.extract_element(values[pairs + r], llir.Constant(i32, u)))
                at = builder.add(builder.mul(width, llir.Constant(i64, u)), llir.Constant(i64, r))
                builder.store(s, builder.gep(out, [at]), align=4)
        return context.get_dummy_value()

    return codegen


def _lm_dot_typer(rows, tokens):
    def typer(typingctx, w, w_off, rb, ws, q_off, d_off, s_off, blocks, depth, stride, y, y_off, width):
        return (types.none(w, w_off, rb, ws, q_off, d_off, s_off, blocks, depth, stride, y, y_off, width),
                _lm_dot_codegen(rows, tokens))

    typer.__name__ = typer.__qualname__ = f"_lm_dot_{rows}x{tokens}"
    return typer


_lm_dot_tile = intrinsic(_lm_dot_typer(TILE_ROWS, TOKENS))     # TILE_ROWS rows of w x TOKENS rows of x
_lm_dot_rows = intrinsic(_lm_dot_typer(ROWS, 1))
_lm_dot_tokens = intrinsic(_lm_dot_typer(1, TOKENS))
_lm_dot_one = intrinsic(_lm_dot_typer(1, 1))
'''


# Panels (q4_1x16, q8_0x16): a vector lane per row of w, so a block's integer dot needs no fold
# and every scale op serves 16 rows at once.
_PANEL_INTRINSICS = '''
def _lm_dot_pairs(builder, acc, w, x):
    # acc + _lm_dot16(w, x), exact in i32: one vpdpwssd with AVX-512 VNNI
    from llvmlite import ir as llir

    v16i, v32s = llir.VectorType(llir.IntType(32), 16), llir.VectorType(llir.IntType(16), 32)
    if _lm_target_has("avx512vnni"):
        return builder.call(_lm_ir_function(builder, "llvm.x86.avx512.vpdpwssd.512", v16i, [v16i, v32s, v32s]),
                            [acc, w, x])
    return builder.add(acc, _lm_dot16(builder, w, x))


def _lm_stream_distance(tokens):
    # how far ahead a panel tile of `tokens` rows of x asks for its weights' lines
    return PREFETCH_BYTES if tokens == 1 else PANEL_ROWS_PREFETCH_BYTES


def _lm_panel_operands(context, builder, sig, args, tokens):
    # a panel tile's operands (w, w_off, ws, q_off, d_off, s_off, blocks, depth, stride, y,
    # y_off, width) as pointers: (the panel's bytes, each row of x's codes, the activation
    # scales, the q4_1 sums, y at y_off, blocks, stride, width)
    from llvmlite import ir as llir

    i64 = llir.IntType(64)
    (w, w_off, ws, q_off, d_off, s_off, blocks, depth, stride, y, y_off,
     width) = _lm_arguments(context, builder, sig, args)[:12]
    panel = _lm_pointer(context, builder, sig.args[0], w, w_off, llir.IntType(8))
    all_codes = _lm_pointer(context, builder, sig.args[2], ws, llir.Constant(i64, 0), llir.IntType(16))
    codes = [builder.gep(all_codes, [builder.add(q_off, builder.mul(depth, llir.Constant(i64, u)))])
             for u in range(tokens)]
    scales = _lm_pointer(context, builder, sig.args[2], ws, d_off, llir.FloatType())
    sums = _lm_pointer(context, builder, sig.args[2], ws, s_off, llir.FloatType())
    out = _lm_pointer(context, builder, sig.args[9], y, y_off, llir.FloatType())
    return panel, codes, scales, sums, out, blocks, stride, width


def _lm_splat(builder, value, vector):
    # the scalar `value` in every lane of LLVM vector type `vector`
    from llvmlite import ir as llir

    i32 = llir.IntType(32)
    one = builder.insert_element(llir.Constant(vector, None), value, llir.Constant(i32, 0))
    return builder.shuffle_vector(one, llir.Constant(vector, None), llir.Constant(llir.VectorType(i32, vector.count),
                                                                                   [0] * vector.count))


def _lm_f16_fields(builder, at, lanes):
    # the `lanes` little-endian f16 at byte pointer `at` as <lanes x f32>, exactly: one
    # vcvtph2ps with F16C, else each by _lm_half's integer path
    from llvmlite import ir as llir

    f32, i32, i64 = llir.FloatType(), llir.IntType(32), llir.IntType(64)
    wide = llir.VectorType(f32, lanes)
    if _lm_target_has("f16c"):
        halves = llir.VectorType(llir.HalfType(), lanes)
        return builder.fpext(builder.load(builder.bitcast(at, halves.as_pointer()), align=1), wide)
    vector = llir.Constant(wide, None)
    for r in range(lanes):
        vector = builder.insert_element(vector, _lm_half(builder, builder.gep(at, [llir.Constant(i64, 2 * r)])),
                                        llir.Constant(i32, r))
    return vector


def _lm_read_ahead(context, builder, sig, args, b):
    # a panel tile's read-ahead in block b (its operands after width: aux, starts, lps, first,
    # end, per_block): lines first + b * per_block + j (j < per_block) below end, line i being
    # the (i % lps)-th 64-byte line of the span at byte starts[i // lps] of aux, asked for into
    # every cache level; never faults, changes no value. Emitted only in a read-ahead motif's
    # module: the others' blocks carry no loop for it
    from llvmlite import ir as llir

    if not READ_AHEAD:
        return
    i64 = llir.IntType(64)
    aux, starts, lps, first, end, per_block = _lm_arguments(context, builder, sig, args)[12:]
    base = builder.bitcast(context.make_array(sig.args[12])(context, builder, aux).data, llir.IntType(8).as_pointer())
    spans = context.make_array(sig.args[13])(context, builder, starts).data

    def line(j, unused):
        i = builder.add(builder.add(first, builder.mul(b, per_block)), j)
        with builder.if_then(builder.icmp_signed("<", i, end)):
            span = builder.sdiv(i, lps)
            at = builder.add(builder.load(builder.gep(spans, [span])),
                             builder.mul(builder.sub(i, builder.mul(span, lps)), llir.Constant(i64, 64)))
            _lm_prefetch(builder, builder.gep(base, [at]), 0)
        return unused

    _lm_vector_loop(builder, per_block, [llir.Constant(i64, 0)], line)


def _lm_panel_codegen(tokens):
    def codegen(context, builder, sig, args):
        if not _lm_target_has("avx512f"):
            return _lm_panel_halves(context, builder, sig, args, tokens)
        # (w, w_off, ws, q_off, d_off, s_off, blocks, depth, stride, y, y_off, width):
        # y[y_off + u * width + r], r < PANEL, for the panel from byte w_off against the
        # `tokens` quantized rows of x from q_off (depth codes apart) and d_off / s_off (block
        # b's at b * stride). Per block a span of PANEL * BLOCK_BYTES bytes: the rows' d, (q4_1)
        # their m, then units c of the rows' code bytes 2c, 2c + 1 (row r at bytes 2r, 2r + 1 of
        # the unit), 8 for q4_1, 16 for q8_0: widened to 16-bit codes, lane r holds q4_1's
        # elements 2c, 2c + 1 in the low nibbles and 2c + 16, 2c + 17 in the high ones, q8_0's
        # elements 2c, 2c + 1
        from llvmlite import ir as llir

        f32, i8, i16, i32, i64 = (llir.FloatType(), llir.IntType(8), llir.IntType(16), llir.IntType(32),
                                  llir.IntType(64))
        v16f, v16i, v32b, v32s = (llir.VectorType(f32, 16), llir.VectorType(i32, 16), llir.VectorType(i8, 32),
                                  llir.VectorType(i16, 32))
        panel, codes, scales, sums, out, blocks, stride, width = _lm_panel_operands(context, builder, sig, args, tokens)
        fma16 = _lm_ir_function(builder, "llvm.fma.v16f32", v16f, [v16f, v16f, v16f])
        zero_i = llir.Constant(v16i, [0] * 16)
        chains = max(1, 4 // tokens)   # independent integer sums per row of x (exact: any split)
        ahead = _lm_stream_distance(tokens)

        def splat(value, vector):
            return _lm_splat(builder, value, vector)

        def fields(at):   # the PANEL f16 at byte pointer `at` as <16 x f32>, exactly
            return _lm_f16_fields(builder, at, PANEL)

        def block(b, accs):
            span = builder.gep(panel, [builder.mul(b, llir.Constant(i64, PANEL * BLOCK_BYTES))])
            for line in range(0, PANEL * BLOCK_BYTES, 64):
                _lm_prefetch(builder, span, ahead + line, 0)   # streamed: non-temporal
            _lm_read_ahead(context, builder, sig, args, b)
            dw = fields(span)
            mw = fields(builder.gep(span, [llir.Constant(i64, 2 * PANEL)])) if Q4 else None
            at_b = builder.mul(b, llir.Constant(i64, BLOCK))
            sums_i = [[zero_i] * chains for _ in range(tokens)]
            for c in range(BLOCK // 4 if Q4 else BLOCK // 2):   # the units of 2 code bytes per row
                raw = builder.load(builder.bitcast(builder.gep(span, [llir.Constant(i64, PANEL * (CODES_OFFSET + 2 * c))]),
                                                   v32b.as_pointer()), align=1)
                if Q4:   # low nibbles: elements 2c, 2c + 1 of each lane's row; high: 2c + 16, 2c + 17
                    wide = builder.zext(raw, v32s)
                    parts = [(builder.and_(wide, llir.Constant(v32s, [15] * 32)), 2 * c),
                             (builder.lshr(wide, llir.Constant(v32s, [4] * 32)), 2 * c + BLOCK // 2)]
                else:    # signed bytes: elements 2c, 2c + 1
                    parts = [(builder.sext(raw, v32s), 2 * c)]
                for h, (wq, element) in enumerate(parts):
                    chain = (len(parts) * c + h) % chains
                    for u in range(tokens):
                        pair = builder.load(builder.bitcast(builder.gep(codes[u], [builder.add(at_b, llir.Constant(i64, element))]),
                                                            i32.as_pointer()), align=2)
                        xq = builder.bitcast(splat(pair, v16i), v32s)
                        sums_i[u][chain] = _lm_dot_pairs(builder, sums_i[u][chain], wq, xq)
            new = []
            at_s = builder.mul(b, stride)
            for u in range(tokens):
                total = sums_i[u][0]
                for more in sums_i[u][1:]:
                    total = builder.add(total, more)
                dx = builder.load(builder.gep(scales, [builder.add(at_s, llir.Constant(i64, u))]), align=4)
                sx = builder.load(builder.gep(sums, [builder.add(at_s, llir.Constant(i64, u))]), align=4) if Q4 else None
                acc = builder.call(fma16, [builder.sitofp(total, v16f), builder.fmul(dw, splat(dx, v16f)), accs[u]])
                new.append(builder.call(fma16, [mw, splat(sx, v16f), acc]) if Q4 else acc)
            return new

        results = _lm_vector_loop(builder, blocks, [llir.Constant(v16f, [0.0] * 16)] * tokens, block)
        for u, result in enumerate(results):
            at = builder.gep(out, [builder.mul(width, llir.Constant(i64, u))])
            builder.store(result, builder.bitcast(at, v16f.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _lm_panel_halves(context, builder, sig, args, tokens):
    # _lm_panel_codegen's tile without AVX-512, on 8-lane vectors (AVX2's ymm; narrower
    # targets split them): the panel's rows as two halves of 8, each activation pair's
    # broadcast serving both, the integer sums in registers (8 ymm for 4 rows of x) and the
    # float accumulators y's own elements, loaded and stored once a block (in registers for
    # one row of x). With a <16 x i32> and a <16 x f32> per row of x in registers, a tile of 4
    # spilled (206 of a block's 560 instructions were stack loads and stores). The same
    # operations on the same values per lane, so the same bits
    from llvmlite import ir as llir

    f32, i8, i16, i32, i64 = (llir.FloatType(), llir.IntType(8), llir.IntType(16), llir.IntType(32),
                              llir.IntType(64))
    v8f, v8i, v16b, v16s = (llir.VectorType(f32, 8), llir.VectorType(i32, 8), llir.VectorType(i8, 16),
                            llir.VectorType(i16, 16))
    panel, codes, scales, sums, out, blocks, stride, width = _lm_panel_operands(context, builder, sig, args, tokens)
    fma8 = _lm_ir_function(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
    zero_i = llir.Constant(v8i, [0] * 8)
    chains = max(1, 4 // tokens)
    ahead = _lm_stream_distance(tokens)
    half_rows = PANEL // 2

    def splat(value, vector):
        return _lm_splat(builder, value, vector)

    def fields(at):   # the half_rows f16 at byte pointer `at` as <8 x f32>, exactly
        return _lm_f16_fields(builder, at, half_rows)

    def kept(value):
        # value through an empty asm statement, which LLVM may not see through: the integer
        # sums are not reassociated across it (reassociated, a unit's products for every row of
        # x were computed first and spilled: 130 stack loads and stores in a 576-instruction
        # block)
        if not _lm_target_has("avx2"):   # no 256-bit register to hold it
            return value
        return builder.asm(llir.FunctionType(value.type, [value.type]), "", "=x,0", [value], False)

    halves = (0, 1)

    def block(b, carried):
        # one block of the panel's two halves against the tile's rows of x
        span = builder.gep(panel, [builder.mul(b, llir.Constant(i64, PANEL * BLOCK_BYTES))])
        for line in range(0, PANEL * BLOCK_BYTES, 64):
            _lm_prefetch(builder, span, ahead + line, 0)   # streamed: non-temporal
        _lm_read_ahead(context, builder, sig, args, b)
        at_b = builder.mul(b, llir.Constant(i64, BLOCK))
        sums_i = {(h, u): [zero_i] * chains for h in halves for u in range(tokens)}
        for c in range(BLOCK // 4 if Q4 else BLOCK // 2):   # the units of 2 code bytes per row
            parts = {}
            for h in halves:
                at = PANEL * (CODES_OFFSET + 2 * c) + 2 * half_rows * h
                raw = builder.load(builder.bitcast(builder.gep(span, [llir.Constant(i64, at)]), v16b.as_pointer()),
                                   align=1)
                if Q4:
                    # widened once for both nibbles (LLVM widened the masked and the shifted bytes apart)
                    wide = kept(builder.zext(raw, v16s))
                    parts[h] = [(builder.and_(wide, llir.Constant(v16s, [15] * 16)), 2 * c),
                                (builder.lshr(wide, llir.Constant(v16s, [4] * 16)), 2 * c + BLOCK // 2)]
                else:
                    parts[h] = [(builder.sext(raw, v16s), 2 * c)]
            for p in range(len(parts[0])):
                chain = (len(parts[0]) * c + p) % chains
                element = parts[0][p][1]
                for u in range(tokens):
                    pair = builder.load(builder.bitcast(builder.gep(codes[u], [builder.add(at_b, llir.Constant(i64, element))]),
                                                        i32.as_pointer()), align=2)
                    xq = builder.bitcast(splat(pair, v8i), v16s)
                    for h in halves:
                        chains_hu = sums_i[h, u]
                        chains_hu[chain] = kept(builder.add(chains_hu[chain], _lm_dot8(builder, parts[h][p][0], xq)))
        at_s = builder.mul(b, stride)
        out_accs = []
        for h in halves:
            dw = fields(builder.gep(span, [llir.Constant(i64, 2 * half_rows * h)]))
            mw = fields(builder.gep(span, [llir.Constant(i64, 2 * PANEL + 2 * half_rows * h)])) if Q4 else None
            for u in range(tokens):
                total = sums_i[h, u][0]
                for more in sums_i[h, u][1:]:
                    total = builder.add(total, more)
                dx = builder.load(builder.gep(scales, [builder.add(at_s, llir.Constant(i64, u))]), align=4)
                prior = carried[len(out_accs)] if in_registers else builder.load(slots[h, u], align=4)
                acc = builder.call(fma8, [builder.sitofp(total, v8f), builder.fmul(dw, splat(dx, v8f)), prior])
                if Q4:
                    sx = builder.load(builder.gep(sums, [builder.add(at_s, llir.Constant(i64, u))]), align=4)
                    acc = builder.call(fma8, [mw, splat(sx, v8f), acc])
                if in_registers:
                    out_accs.append(acc)
                else:
                    builder.store(acc, slots[h, u], align=4)
        return out_accs if in_registers else carried

    slots = {(h, u): builder.bitcast(builder.gep(out, [builder.add(builder.mul(width, llir.Constant(i64, u)),
                                                                   llir.Constant(i64, half_rows * h))]), v8f.as_pointer())
             for h in range(2) for u in range(tokens)}
    in_registers = tokens == 1   # one row of x: its two float accumulators stay in registers
    if not in_registers:
        for slot in slots.values():
            builder.store(llir.Constant(v8f, [0.0] * 8), slot, align=4)
    inits = [llir.Constant(v8f, [0.0] * 8)] * (len(halves) * tokens) if in_registers else [llir.Constant(i64, 0)]
    results = _lm_vector_loop(builder, blocks, inits, block)
    if in_registers:
        for (h, u), acc in zip([(h, u) for h in halves for u in range(tokens)], results):
            builder.store(acc, slots[h, u], align=4)
    return context.get_dummy_value()


def _lm_panel_typer(tokens):
    def typer(typingctx, w, w_off, ws, q_off, d_off, s_off, blocks, depth, stride, y, y_off, width, aux, starts,
              lps, first, end, per_block):
        return (types.none(w, w_off, ws, q_off, d_off, s_off, blocks, depth, stride, y, y_off, width, aux, starts, lps,
                           first, end, per_block), _lm_panel_codegen(tokens))

    typer.__name__ = typer.__qualname__ = f"_lm_panel_{tokens}"
    return typer


_lm_panel_tile = intrinsic(_lm_panel_typer(TOKENS))
_lm_panel_4 = intrinsic(_lm_panel_typer(4))
_lm_panel_2 = intrinsic(_lm_panel_typer(2))
_lm_panel_1 = intrinsic(_lm_panel_typer(1))
'''


def function_name(motif: str) -> str:
    return f"k_{motif}"


def render_module(motif: str = "matmul_q4_1_i16") -> str:
    """The generated numba module of one motif, written to the kernel cache like every kernel."""
    import numba

    from loomc.lower.numba_helpers import IMPORTS

    dtype = MOTIFS[motif]
    header = (f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.\n"
              f"# motif {motif}: y = x . w^T, {dtype} w against x quantized to 16-bit codes per block of 32, "
              f"integer dot products (loomc/lower/qdot.py)\n")
    constants = (f"PREFETCH_BYTES = {PREFETCH_BYTES}\nPARALLEL_QUANTIZE_BLOCKS = {PARALLEL_QUANTIZE_BLOCKS}\nGROUP = {QUANTIZE_GROUP}\nBLOCK = {BLOCK}\nBLOCK_BYTES = {BLOCK_BYTES[dtype]}\n"
                 f"CODES_OFFSET = {DTYPES[dtype].codes_offset}\nQ4 = {(DTYPES[dtype].panel_of or dtype) == 'q4_1'}\n")
    if PANEL_ROWS[dtype]:
        constants += (f"PANEL = {PANEL_ROWS[dtype]}\nTOKENS = {panel_tokens()}\nAHEAD_TOKENS = {AHEAD_TOKENS}\n"
                      f"PANEL_ROWS_PREFETCH_BYTES = {PANEL_ROWS_PREFETCH_BYTES}\n"
                      f"READ_AHEAD = {motif in AHEAD}\n")
        intrinsics, driver = _PANEL_INTRINSICS, _PANEL_AHEAD_DRIVER if motif in AHEAD else _PANEL_DRIVER
    else:
        tile_rows, tile_tokens = tile_shape()
        constants += f"ROWS = {ROWS}\nTILE_ROWS = {tile_rows}\nTOKENS = {tile_tokens}\n"
        intrinsics, driver = _ROW_INTRINSICS, _DRIVER
    return (header + IMPORTS + "\n" + constants + VECTOR_LOOP_SOURCE + _INTRINSICS + intrinsics + "\n"
            + driver.replace("FUNCTION", function_name(motif)))


def workspace_for(motif: str, dims: list[list[int]], scalars: list) -> int:
    """`workspace_elems` from the operands' dimensions (x, w, y, ...), as a command dispatches them."""
    rows, depth = dims[0]
    return workspace_elems(rows, depth)


def launch_arguments(motif: str, values: list, workspace: np.ndarray) -> tuple:
    """The driver's arguments (x, w's block bytes, y, workspace, and a read-ahead motif's
    k_cache, rows, positions, page_table, layer); ValueError when the shapes do not make
    y = x . w^T or an operand is not contiguous (the driver reads them by address)."""
    x, w, y = values[:3]
    t, k = x.shape
    n = w.shape[0]
    if k % BLOCK or w.shape != (n, k // BLOCK * BLOCK_BYTES[MOTIFS[motif]]) or y.shape != (t, n):
        raise ValueError(f"x {x.shape}, w {w.shape} (block bytes), y {y.shape} do not make y = x . w^T")
    if PANEL_ROWS[MOTIFS[motif]] and n % PANEL_ROWS[MOTIFS[motif]]:
        raise ValueError(f"w {w.shape}: {MOTIFS[motif]} holds whole panels of {PANEL_ROWS[MOTIFS[motif]]} rows")
    if not (x.flags.c_contiguous and w.flags.c_contiguous and y.flags.c_contiguous):
        raise ValueError("x, w and y must be contiguous")
    if workspace.size < workspace_elems(t, k):   # the driver writes the codes there by address
        raise ValueError(f"a workspace of {workspace.size} floats; x {x.shape} needs {workspace_elems(t, k)}")
    if motif not in AHEAD:
        return x, w, y, workspace
    k_cache, rows, positions, page_table, layer = values[3:]
    if not k_cache.flags.c_contiguous:
        raise ValueError("the cache read ahead must be contiguous (its lines are asked for by address)")
    if rows.shape != positions.shape:
        raise ValueError(f"rows {rows.shape} and positions {positions.shape} must have one entry per token")
    return x, w, y, workspace, k_cache, rows, positions, page_table, int(layer)


def argument_examples(motif: str = "matmul_q4_1_i16") -> tuple:
    """One value of each argument's exact type as dispatch passes them, for compiling ahead."""
    rows = max(1, PANEL_ROWS[MOTIFS[motif]])
    matmul = (np.zeros((1, BLOCK), np.float32), np.zeros((rows, BLOCK_BYTES[MOTIFS[motif]]), np.uint8),
              np.zeros((1, rows), np.float32), np.zeros(workspace_elems(1, BLOCK), np.float32))
    if motif not in AHEAD:
        return matmul
    i32 = np.zeros(1, np.int32)
    return matmul + (np.zeros((1, 1, 1, 1), np.float32), i32, i32, np.zeros((1, 1), np.int32), 0)


def load_function(motif: str = "matmul_q4_1_i16", cache_dir: Path | None = None):
    """The compiled (lazily, then cached on disk) numba dispatcher: it takes `launch_arguments`."""
    from loomc.lower.numba import ensure_module, load_module, module_path

    text = render_module(motif)
    path = module_path(text, cache_dir)
    ensure_module(path, text)
    return getattr(load_module(path), function_name(motif))

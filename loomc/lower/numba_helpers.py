"""The helper functions that generated numba modules call, emitted only when used.

Called by `lower/numba.py` (`helpers_for(text)`). Helpers are copied into every module
that uses them, never imported, because numba's disk cache only watches the generated
file (STYLE §5). They are plain `@njit` functions rather than `inline="always"`: LLVM
inlines them all the same (no call is left in a compiled kernel), and numba's own
inlining made the jammed matmuls take 4x longer to compile.

f16: values are f32 that hold an exact f16 value; `_lm_f16_from_bits` widens branch-free
(shift into place, rescale by 2^112, restore inf/nan), `_lm_f16_bits` narrows with
round-to-nearest-even (Giesen's float_to_half_fast3_rtne). bf16 rounds the same way on
the top 16 bits. Quantized blocks read their f16 scale (and min) with `_lm_half_at`
straight from the GGUF bytes: an intrinsic that loads the half and widens it with LLVM's
`fpext` (one `vcvtph2ps` with F16C, 18% of a Q4_1 matvec at T = 1), falling back to
`_lm_f16_from_bits` when numba targets a CPU without F16C. The two agree on every value
except a signalling NaN scale, which the hardware conversion returns quieted (the result
is NaN either way).
"""

from __future__ import annotations

def helpers_for(text: str) -> list[str]:
    """The source of every helper `text` calls, dependencies first."""
    needed: list[str] = []

    def want(name: str) -> None:
        if name in needed:
            return
        for dep in _HELPER_DEPS.get(name, ()):
            want(dep)
        needed.append(name)

    for name in _HELPERS:
        if name + "(" in text:
            want(name)
    return [_HELPERS[n].strip("\n") for n in needed]


IMPORTS = """import math

import numpy as np
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
"""

_HELPERS = {
    "_lm_min": '''
@njit(cache=True)
def _lm_min(a, b):
    return b if b < a else a''',
    "_lm_max": '''
@njit(cache=True)
def _lm_max(a, b):
    return b if b > a else a''',
    "_lm_sdiv": '''
@njit(cache=True)
def _lm_sdiv(a, b):
    # signed division truncating toward zero (numba's // floors); 0 when b == 0
    q = a // b
    if q < 0 and q * b != a:
        q += 1
    return q''',
    "_lm_smod": '''
@njit(cache=True)
def _lm_smod(a, b):
    # remainder with the sign of the dividend; 0 when b == 0
    if b == 0:
        return a - a
    return a - b * _lm_sdiv(a, b)''',
    "_lm_f16_from_bits": '''
@njit(cache=True)
def _lm_f16_from_bits(h):
    # IEEE half bits -> f32, branch-free for finite values: shift the exponent and mantissa
    # into place and rescale by 2^112; inf/nan get the f32 exponent back.
    h = np.uint32(h) & np.uint32(0xFFFF)
    mag = np.uint32((h & np.uint32(0x7FFF)) << np.uint32(13)).view(np.float32) * np.float32(5.192296858534828e33)
    bits = np.uint32(np.float32(mag).view(np.uint32))
    if (h & np.uint32(0x7C00)) == np.uint32(0x7C00):
        bits = np.uint32(bits | np.uint32(0x7F800000))
    return np.uint32(bits | ((h & np.uint32(0x8000)) << np.uint32(16))).view(np.float32)''',
    "_lm_f16_bits": '''
@njit(cache=True)
def _lm_f16_bits(x):
    # f32 -> IEEE half bits, round to nearest even (overflow to inf, subnormals, NaN kept)
    f = np.uint32(np.float32(x).view(np.uint32))
    sign = np.uint32(f & np.uint32(0x80000000))
    f = np.uint32(f ^ sign)
    if f >= np.uint32(0x47800000):
        o = np.uint32(0x7E00) if f > np.uint32(0x7F800000) else np.uint32(0x7C00)
    elif f < np.uint32(0x38800000):
        o = np.uint32(np.float32(np.uint32(f).view(np.float32) + np.float32(0.5)).view(np.uint32) - np.uint32(0x3F000000))
    else:
        o = np.uint32(np.uint32(f + np.uint32(0xC8000FFF) + ((f >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13))
    return np.uint16(o | (sign >> np.uint32(16)))''',
    "_lm_round_f16": '''
@njit(cache=True)
def _lm_round_f16(x):
    return _lm_f16_from_bits(_lm_f16_bits(x))''',
    "_lm_bf16_from_bits": '''
@njit(cache=True)
def _lm_bf16_from_bits(h):
    return np.uint32((np.uint32(h) & np.uint32(0xFFFF)) << np.uint32(16)).view(np.float32)''',
    "_lm_bf16_bits": '''
@njit(cache=True)
def _lm_bf16_bits(x):
    # f32 -> bfloat16 bits, round to nearest even; NaN stays NaN
    f = np.uint32(np.float32(x).view(np.uint32))
    if (f & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((f >> np.uint32(16)) | np.uint32(0x40))
    return np.uint16(np.uint32(f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))''',
    "_lm_f32_odd": '''
@njit(cache=True)
def _lm_f32_odd(x):
    # f64 -> f32 rounded to odd: of the two f32 neighbours of x, the one with an odd
    # mantissa. Narrowing that to f16 with round-to-nearest-even then equals rounding x
    # once (f32 keeps more than two extra bits), where np.float32 first would round twice.
    y = np.float32(x)
    if np.float64(y) == x or y != y or math.isinf(y):
        return y
    bits = np.uint32(y.view(np.uint32))
    if bits & np.uint32(1):
        return y
    if abs(x) > abs(np.float64(y)):
        return np.uint32(bits + np.uint32(1)).view(np.float32)
    return np.uint32(bits - np.uint32(1)).view(np.float32)''',
    "_lm_round_bf16": '''
@njit(cache=True)
def _lm_round_bf16(x):
    return _lm_bf16_from_bits(_lm_bf16_bits(x))''',
    "_lm_half_at": '''
@intrinsic
def _lm_half_at(typingctx, w, offset):
    # the little-endian f16 at byte `offset` of a GGUF block (uint8 buffer), as f32: LLVM's
    # exact fpext (one vcvtph2ps) where the target has F16C, else _lm_f16_from_bits
    if not (isinstance(w, types.Array) and w.dtype == types.uint8 and isinstance(offset, types.Integer)):
        return None
    sig = types.float32(w, offset)

    def bits_at(w, offset):
        lo = np.uint32(w[np.uint64(offset)])
        hi = np.uint32(w[np.uint64(offset + 1)])
        return _lm_f16_from_bits(lo | (hi << np.uint32(8)))

    def codegen(context, builder, sig, args):
        import llvmlite.binding as ll
        from llvmlite import ir as llir
        from numba.core import config

        named = (config.CPU_NAME or "host").lower()
        features = config.CPU_FEATURES if config.CPU_FEATURES is not None else ""
        f16c = "+f16c" in features or (named == "host" and ll.get_host_cpu_features().get("f16c", False)
                                       and "-f16c" not in features)
        if not f16c:
            return context.compile_internal(builder, bits_at, sig, args)
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        at = builder.gep(data, [context.cast(builder, args[1], sig.args[1], types.int64)])
        half = builder.load(builder.bitcast(at, llir.HalfType().as_pointer()), align=1)
        return builder.fpext(half, llir.FloatType())

    return sig, codegen''',
    "_lm_q4": '''
@njit(cache=True)
def _lm_q4(w, offset, sub):
    # a 4-bit code: low nibble of the byte for elements 0..15 of a block, high for 16..31
    return np.int32((np.int32(w[np.uint64(offset)]) >> np.int32(sub << 2)) & np.int32(15))''',
    "_lm_q8": '''
@njit(cache=True)
def _lm_q8(w, offset):
    return np.int32(np.int8(w[np.uint64(offset)]))''',
    "_lm_exp": '''
@intrinsic
def _lm_exp(typingctx, x):
    # exp: an f32 as the nearest f32 to 2^k p(r), x = k ln 2 + r, p exp's Taylor polynomial of
    # degree 11 in f64 (within 1e-14 before the one rounding to f32, so the correctly rounded
    # exp for all but about 1 input in 10^7; x clamped to [-150, 150], past which it is 0 or
    # inf all the same), in plain IR: a loop of it vectorizes, and every CPU and C library
    # gives the same bits. f64: llvm.exp (the C library's exp).
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        from llvmlite import ir as llir

        (v,) = args
        if sig.args[0].bitwidth != 32:
            fn = cgutils.get_or_insert_function(builder.module, llir.FunctionType(v.type, [v.type]), "llvm.exp.f64")
            return builder.call(fn, [v])
        f64, i64 = llir.DoubleType(), llir.IntType(64)

        def c(value):
            return llir.Constant(f64, value)

        z = builder.fpext(v, f64)
        z = builder.select(builder.fcmp_ordered("<", z, c(-150.0)), c(-150.0), z)   # NaN stays NaN
        z = builder.select(builder.fcmp_ordered(">", z, c(150.0)), c(150.0), z)
        floor = cgutils.get_or_insert_function(builder.module, llir.FunctionType(f64, [f64]), "llvm.floor.f64")
        k = builder.call(floor, [builder.fadd(builder.fmul(z, c(1.4426950408889634)), c(0.5))])
        # 2^k from k's bits without a conversion (none for f64 -> i64 before AVX-512): k + 1.5 * 2^52
        # holds k in its low bits
        magic = 6755399441055744.0
        bits = builder.sub(builder.bitcast(builder.fadd(k, c(magic)), i64), llir.Constant(i64, 0x4338000000000000))
        scale = builder.bitcast(builder.shl(builder.add(bits, llir.Constant(i64, 1023)), llir.Constant(i64, 52)), f64)
        r = builder.fma(k, c(-0.6931471805599453), z)
        p = c(1.0 / 39916800.0)
        for n in range(10, -1, -1):   # Horner down to 1/0!
            p = builder.fma(p, r, c(1.0 / math.factorial(n)))
        return builder.fptrunc(builder.fmul(p, scale), llir.FloatType())

    return x(x), codegen''',
    "_lm_fma": '''
@intrinsic
def _lm_fma(typingctx, a, b, c):
    # llvm.fma: a * b + c with a single rounding
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        return builder.fma(*args)

    return a(a, b, c), codegen''',
    "_lm_fold": '''
@intrinsic
def _lm_fold(typingctx, a, width):
    # a[z] = a[z] + a[z + width] for z in 0..width, as whole vectors: one load of the first
    # 2 * width elements, the add of its two halves, one store (a float stack array)
    if not (isinstance(a, types.Array) and isinstance(a.dtype, types.Float) and isinstance(width, types.IntegerLiteral)):
        return None
    half = width.literal_value

    def codegen(context, builder, sig, args):
        from llvmlite import ir as llir

        elem = context.get_data_type(sig.args[0].dtype)
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        align = context.get_abi_sizeof(elem)  # the array promises element alignment only
        both = builder.load(builder.bitcast(data, llir.VectorType(elem, 2 * half).as_pointer()), align=align)

        def lanes(first):
            return llir.Constant(llir.VectorType(llir.IntType(32), half), [first + i for i in range(half)])

        total = builder.fadd(builder.shuffle_vector(both, both, lanes(0)), builder.shuffle_vector(both, both, lanes(half)))
        builder.store(total, builder.bitcast(data, llir.VectorType(elem, half).as_pointer()), align=align)
        return context.get_dummy_value()

    return types.none(a, width), codegen''',
    "_lm_alloca": '''
@intrinsic
def _lm_alloca(typingctx, count, dtype):
    # a stack buffer of `count` elements in the function's entry block (one per thread),
    # aligned to a cache line so that vector loads from it never straddle two
    if not isinstance(count, types.IntegerLiteral) or not isinstance(dtype, types.NumberClass):
        return None
    elem = dtype.instance_type
    size = count.literal_value

    def codegen(context, builder, sig, args):
        ptr = cgutils.alloca_once(builder, context.get_data_type(elem), size=size)
        ptr.align = 64
        return ptr

    return types.CPointer(elem)(count, dtype), codegen''',
}
_HELPER_DEPS = {
    "_lm_smod": ("_lm_sdiv",), "_lm_round_f16": ("_lm_f16_from_bits", "_lm_f16_bits"),
    "_lm_round_bf16": ("_lm_bf16_from_bits", "_lm_bf16_bits"), "_lm_half_at": ("_lm_f16_from_bits",),
}

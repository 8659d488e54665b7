"""The C helper functions that CUDA module text calls, emitted only when used.

Called by `lower/cuda.py` (`helpers_for(text)`). Every helper is plain C++ that compiles
for the device (nvcc, or NVRTC through `cupy.RawModule`, with no headers at all) and for
the host (g++), which is how the drift test runs the very same text on the CPU and
compares it with `loomc.ir.interpret`. Only the four float<->bits primitives differ
between the two: CUDA intrinsics on the device, `__builtin_memcpy` on the host.

f16/bf16 use explicit bit conversions with the same algorithms as the numba renderer's
`_lm_f16_bits`/`_lm_f16_from_bits` (no `cuda_fp16.h`): values live in `float`, rounded
to their type after every op; buffers hold the 16-bit patterns.
"""

from __future__ import annotations

import re

from loomc.dtypes import DTYPES
from loomc.ir import module as ir

# The C spelling of each numpy type that `loomc.dtypes` names for computing or storing.
C_SPELLING = {"bool_": "bool", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
              "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
              "uint64": "unsigned long long", "float32": "float", "float64": "double"}
# The C type each dtype computes in (f16/bf16 values live in float).
C_TYPE = {t: C_SPELLING[d.compute] for t, d in DTYPES.items() if d.compute}
# The unsigned type the wrapping ops of an integer dtype compute in (at least 32 bits, so
# that C's promotion of narrow operands to signed int can never overflow).
WIDE_UNSIGNED = {d: "unsigned long long" if ir.BITS[d] == 64 else "unsigned int" for d in ir.INT_DTYPES}
# The unsigned type of the same width (bit patterns).
SAME_WIDTH_UNSIGNED = {t: C_SPELLING[f"uint{bits}"] for t, bits in ir.BITS.items()}

PRELUDE = """\
#if defined(__CUDACC__)
#define LM_FN __device__ __forceinline__
#else
#define LM_FN static inline
#endif
"""

_FIXED = {
    "bits": (("lm_f32_bits", "lm_f32_from_bits"), (), """\
#if defined(__CUDA_ARCH__)
LM_FN unsigned int lm_f32_bits(float x) { return __float_as_uint(x); }
LM_FN float lm_f32_from_bits(unsigned int u) { return __uint_as_float(u); }
#else
LM_FN unsigned int lm_f32_bits(float x) { unsigned int u; __builtin_memcpy(&u, &x, 4); return u; }
LM_FN float lm_f32_from_bits(unsigned int u) { float x; __builtin_memcpy(&x, &u, 4); return x; }
#endif"""),
    "bits64": (("lm_f64_bits", "lm_f64_from_bits"), (), """\
#if defined(__CUDA_ARCH__)
LM_FN unsigned long long lm_f64_bits(double x) { return (unsigned long long)__double_as_longlong(x); }
LM_FN double lm_f64_from_bits(unsigned long long u) { return __longlong_as_double((long long)u); }
#else
LM_FN unsigned long long lm_f64_bits(double x) { unsigned long long u; __builtin_memcpy(&u, &x, 8); return u; }
LM_FN double lm_f64_from_bits(unsigned long long u) { double x; __builtin_memcpy(&x, &u, 8); return x; }
#endif"""),
    "f16_from_bits": (("lm_f16_from_bits",), ("bits",), """\
LM_FN float lm_f16_from_bits(unsigned int h) {
    // IEEE half bits -> f32, exact: a normal half moves exponent and mantissa into place and
    // rescales by 2^112; a subnormal half is its mantissa times 2^-24 (integer to float, then
    // a power of two: no f32 subnormal is ever an operand, so a device that flushes them,
    // whatever the compile options, converts it exactly too); inf and NaN get the f32
    // exponent back.
    h &= 0xFFFFu;
    float normal = lm_f32_from_bits((h & 0x7FFFu) << 13) * lm_f32_from_bits(0x77800000u);
    float subnormal = (float)(h & 0x3FFu) * lm_f32_from_bits(0x33800000u);
    unsigned int bits = lm_f32_bits((h & 0x7C00u) == 0u ? subnormal : normal);
    if ((h & 0x7C00u) == 0x7C00u) bits |= 0x7F800000u;
    return lm_f32_from_bits(bits | ((h & 0x8000u) << 16));
}"""),
    "f16_bits": (("lm_f16_bits",), ("bits",), """\
LM_FN unsigned short lm_f16_bits(float x) {
    // f32 -> IEEE half bits, round to nearest even; overflow gives inf, NaN stays NaN
    unsigned int f = lm_f32_bits(x);
    unsigned int sign = f & 0x80000000u;
    unsigned int o;
    f ^= sign;
    if (f >= 0x47800000u) {
        o = f > 0x7F800000u ? 0x7E00u : 0x7C00u;
    } else if (f < 0x38800000u) {  // a half subnormal: the f32 adder rounds the mantissa
        o = lm_f32_bits(lm_f32_from_bits(f) + 0.5f) - 0x3F000000u;
    } else {
        o = (f + 0xC8000FFFu + ((f >> 13) & 1u)) >> 13;
    }
    return (unsigned short)(o | (sign >> 16));
}"""),
    "round_f16": (("lm_round_f16",), ("f16_from_bits", "f16_bits"), """\
LM_FN float lm_round_f16(float x) { return lm_f16_from_bits(lm_f16_bits(x)); }"""),
    "round_f16_f64": (("lm_round_f16_f64",), ("round_f16",), """\
LM_FN float lm_round_f16_f64(double x) {
    // f64 -> f16 with one rounding: narrow to f32 rounding to odd (truncate, then set the
    // last bit if anything was lost; f32 keeps 13 more bits than f16), then round to f16.
    float f = (float)x;
    unsigned int u = lm_f32_bits(f);
    if ((double)f != x && x == x) {
        if (x > 0.0 ? (double)f > x : (double)f < x) u -= 1u;
        u |= 1u;
    }
    return lm_round_f16(lm_f32_from_bits(u));
}"""),
    "bf16_from_bits": (("lm_bf16_from_bits",), ("bits",), """\
LM_FN float lm_bf16_from_bits(unsigned int h) { return lm_f32_from_bits((h & 0xFFFFu) << 16); }"""),
    "bf16_bits": (("lm_bf16_bits",), ("bits",), """\
LM_FN unsigned short lm_bf16_bits(float x) {
    // f32 -> bfloat16 bits, round to nearest even; NaN stays NaN
    unsigned int f = lm_f32_bits(x);
    if ((f & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((f >> 16) | 0x40u);
    return (unsigned short)((f + 0x7FFFu + ((f >> 16) & 1u)) >> 16);
}"""),
    "round_bf16": (("lm_round_bf16",), ("bf16_from_bits", "bf16_bits"), """\
LM_FN float lm_round_bf16(float x) { return lm_bf16_from_bits(lm_bf16_bits(x)); }"""),
    "half_at": (("lm_half_at",), ("f16_from_bits",), """\
LM_FN float lm_half_at(const unsigned char* w, long long offset) {
    // the little-endian f16 at byte `offset` of a GGUF block, as f32
    return lm_f16_from_bits((unsigned int)w[offset] | ((unsigned int)w[offset + 1] << 8));
}"""),
    "q4": (("lm_q4",), (), """\
LM_FN int lm_q4(const unsigned char* w, long long offset, long long sub) {
    // a 4-bit code: the low nibble for elements 0..15 of a block, the high one for 16..31
    return ((int)w[offset] >> (int)(sub << 2)) & 15;
}"""),
    "q8": (("lm_q8",), (), """\
LM_FN int lm_q8(const unsigned char* w, long long offset) { return (int)(signed char)w[offset]; }"""),
    "minmax": (("lm_min", "lm_max"), (), """\
// min and max are the IR's selects: a NaN second operand loses, a NaN first operand wins
template <typename T> LM_FN T lm_min(T a, T b) { return b < a ? b : a; }
template <typename T> LM_FN T lm_max(T a, T b) { return b > a ? b : a; }"""),
    "classify": (("lm_isnan_f32", "lm_isinf_f32"), ("bits",), """\
LM_FN bool lm_isnan_f32(float x) { return (lm_f32_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
LM_FN bool lm_isinf_f32(float x) { return (lm_f32_bits(x) & 0x7FFFFFFFu) == 0x7F800000u; }"""),
    "classify64": (("lm_isnan_f64", "lm_isinf_f64"), ("bits64",), """\
LM_FN bool lm_isnan_f64(double x) { return (lm_f64_bits(x) & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull; }
LM_FN bool lm_isinf_f64(double x) { return (lm_f64_bits(x) & 0x7FFFFFFFFFFFFFFFull) == 0x7FF0000000000000ull; }"""),
}
_PROVIDER = {fn: key for key, (names, _, _) in _FIXED.items() for fn in names}

# Integer ops where C would be undefined (signed overflow, INT_MIN / -1, division by zero)
# or would promote narrow operands to signed int: computed in a wide unsigned type and
# converted back, which wraps (C++20 defines the conversion; nvcc and gcc always did).
_INT_OPS = {
    "add": "({c})(({u})a + ({u})b)",
    "sub": "({c})(({u})a - ({u})b)",
    "mul": "({c})(({u})a * ({u})b)",
    "shl": "({c})(({u})a << b)",
}
_INT_FN = re.compile(r"lm_(add|sub|mul|shl|neg|div|mod|abs)_(i8|i16|i32|i64|u8|u16|u32|u64)\Z")


def _int_helper(op: str, dtype: str) -> tuple[str, tuple[str, ...]]:
    c, u = C_TYPE[dtype], WIDE_UNSIGNED[dtype]
    name = f"lm_{op}_{dtype}"
    signed = not ir.is_unsigned(dtype)
    if op in _INT_OPS:
        return f"LM_FN {c} {name}({c} a, {c} b) {{ return {_INT_OPS[op].format(c=c, u=u)}; }}", ()
    if op == "neg":
        return f"LM_FN {c} {name}({c} a) {{ return ({c})(({u})0 - ({u})a); }}", ()
    if op == "abs":
        return f"LM_FN {c} {name}({c} a) {{ return ({c})(a < 0 ? ({u})0 - ({u})a : ({u})a); }}", ()
    if op == "div":
        if signed:  # truncating; x / 0 is 0 and MIN / -1 wraps to MIN
            return (f"LM_FN {c} {name}({c} a, {c} b) {{ return b == 0 ? ({c})0 : b == ({c})-1 ? lm_neg_{dtype}(a) "
                    f": ({c})(a / b); }}"), (f"lm_neg_{dtype}",)
        return f"LM_FN {c} {name}({c} a, {c} b) {{ return b == 0 ? ({c})0 : ({c})(a / b); }}", ()
    # mod: the sign of the dividend; x % 0 is 0, and so is MIN % -1
    zero = "b == 0 || b == ({c})-1" if signed else "b == 0"
    return f"LM_FN {c} {name}({c} a, {c} b) {{ return {zero.format(c=c)} ? ({c})0 : ({c})(a % b); }}", ()


def _entry(name: str) -> tuple[str, tuple[str, ...]] | None:
    """(text, names it depends on) of the helper that defines function `name`."""
    if name in _PROVIDER:
        key = _PROVIDER[name]
        _, deps, text = _FIXED[key]
        return text, tuple(_FIXED[d][0][0] for d in deps)
    m = _INT_FN.match(name)
    return _int_helper(m.group(1), m.group(2)) if m else None


def helpers_for(text: str) -> str:
    """The definitions of every `lm_` helper that `text` calls, dependencies first."""
    done: list[str] = []
    seen: set[str] = set()

    def want(name: str) -> None:
        entry = _entry(name)
        if entry is None:
            return
        body, deps = entry
        key = _PROVIDER.get(name, name)
        if key in seen:
            return
        seen.add(key)
        for dep in deps:
            want(dep)
        done.append(body)

    for name in sorted(set(re.findall(r"\blm_\w+", text))):
        want(name)
    return "\n".join(done)

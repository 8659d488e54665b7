"""The built-in names of each context: kernel math, command motifs, control host functions.

One table per context so the checker, the lowerings and the VM agree on what exists.
"""

from __future__ import annotations

# Kernel math intrinsics. "float": one float operand, same type out. "same": all operands
# share one numeric type, which is the result. "select": (bool, T, T) -> T.
KERNEL_MATH: dict[str, tuple[str, int]] = {
    "exp": ("float", 1), "exp2": ("float", 1), "log": ("float", 1), "log2": ("float", 1),
    "sqrt": ("float", 1), "rsqrt": ("float", 1), "tanh": ("float", 1), "erf": ("float", 1),
    "sin": ("float", 1), "cos": ("float", 1), "floor": ("float", 1), "ceil": ("float", 1),
    "sigmoid": ("float", 1), "pow": ("float", 2), "fma": ("float", 3),
    "abs": ("same", 1), "min": ("same", 2), "max": ("same", 2),
    "select": ("select", 3),
    "isnan": ("predicate", 1), "isinf": ("predicate", 1),
}

# Command motifs provided by the compiler as intrinsics (`matmul`, `matmul_f16`, `bmm`: loomc/lower/matmul.py;
# `conv3x3`: loomc/lower/conv3x3.py; `attention`: loomc/lower/attention.py; `attention_paged`, `attention_paged_f16v`:
# loomc/lower/paged_attention.py; `matmul_q4_1_i16`,
# `matmul_q8_0_i16`, `matmul_q4_1x16_i16`, `matmul_q8_0x16_i16`, `matmul_q4_1x16_i16_ahead`: loomc/lower/qdot.py; `matmul_i8`: loomc/lower/i8gemm.py), declared in `.loom` signature syntax so shapes are checked exactly
# like calls to `.loom` kernels (conv3x3's K = 9 C and TO, which depend on its scalars, at dispatch).
COMMAND_MOTIFS_SOURCE = """
stage matmul(a: f32[M, K], b: f32[N, K], out c: f32[M, N])
stage matmul_f16(a: f32[M, K], b: f16[N, K], out c: f32[M, N])
stage bmm(a: f32[G, M, K], b: f32[G, N, K], out c: f32[G, M, N])
stage conv3x3(x: f32[T, C], w: f32[O, K], bias: f32[O], height: i64, width: i64, stride: i64, out y: f32[TO, O])
stage attention(qkv: f32[T, C], heads: i64, tokens: i64, scale: f32, out y: f32[T, D])
stage attention_paged(q: f32[T, QD], rows: i32[T], positions: i32[T], page_table: i32[R, P], k_cache: f32[N, L, S, KD], v_cache: f32[N, L, S, KD], layer: i64, heads: i64, kv_heads: i64, scale: f32, out o: f32[T, QD])
stage attention_paged_f16v(q: f32[T, QD], rows: i32[T], positions: i32[T], page_table: i32[R, P], k_cache: f32[N, L, S, KD], v_cache: f16[N, L, S, KD], layer: i64, heads: i64, kv_heads: i64, scale: f32, out o: f32[T, QD])
stage matmul_q4_1_i16(x: f32[T, K], w: q4_1[N, K], out y: f32[T, N])
stage matmul_q8_0_i16(x: f32[T, K], w: q8_0[N, K], out y: f32[T, N])
stage matmul_q4_1x16_i16(x: f32[T, K], w: q4_1x16[N, K], out y: f32[T, N])
stage matmul_q8_0x16_i16(x: f32[T, K], w: q8_0x16[N, K], out y: f32[T, N])
stage matmul_q4_1x16_i16_ahead(x: f32[T, K], w: q4_1x16[N, K], out y: f32[T, N], k_cache: f32[C, L, S, KD], rows: i32[U], positions: i32[U], page_table: i32[R, P], layer: i64)
stage matmul_i8(a: f32[M, K], b: i8[NB, KQ, 64], scale: f32[1], out c: f32[M, N])
"""

# Control host functions: name -> (parameter types, result type). "any" accepts every value.
# loomc/run/host.py implements each one; docs/language.md §12 documents them.
CONTROL_HOST: dict[str, tuple[tuple[str, ...], str]] = {
    "len": (("any",), "int"),
    "keys": (("map",), "list"),
    "values": (("map",), "list"),
    "has": (("map", "str"), "bool"),
    "contains": (("any", "any"), "bool"),
    "startswith": (("str", "str"), "bool"),
    "endswith": (("str", "str"), "bool"),
    "find": (("str", "str"), "int"),
    "split": (("str", "str"), "list"),
    "join": (("list", "str"), "str"),
    "replace": (("str", "str", "str"), "str"),
    "strip": (("str",), "str"),
    "lower": (("str",), "str"),
    "upper": (("str",), "str"),
    "slice": (("any", "int", "int"), "any"),
    "append": (("list", "any"), "null"),
    "type_of": (("any",), "str"),
    "json_encode": (("any",), "str"),
    "json_decode": (("str",), "any"),
    "regex_match": (("str", "str"), "any"),
    "tokenize": (("any", "str"), "list"),
    "detokenize": (("any", "list"), "str"),
    "encode_utf8": (("str",), "bytes"),
    "decode_utf8": (("bytes",), "str"),
    "approx": (("float", "float", "float"), "bool"),
    "fail": (("int", "str"), "null"),
    "min": (("any", "any"), "any"),
    "max": (("any", "any"), "any"),
    "abs": (("any",), "any"),
}

# Dynamic conversions: `int(x)`, `float(x)`, `str(x)`, `bool(x)`.
CONTROL_CONVERSIONS = ("int", "float", "str", "bool")

# Weight-preparation functions allowed in `param` initialisers.
PREPARE_FUNCTIONS = ("checkpoint", "transpose", "cast", "concat", "reshape", "quantize", "repack", "compute")

# Host dimension in front of each state scope. The angle brackets keep it apart from any
# name a program can write, so it never unifies with an unrelated per-call symbol.
STATE_SCOPES = {"row": "<rows>", "page": "<pages>", "request": "<requests>"}

"""Reference semantics of IR scalar expressions, evaluated in Python.

The command specializer folds constant scalars with it, the host evaluates per-call
scalar arguments and shape dimensions with it, and tests compare each renderer's output
against it. Integers are Python ints kept inside their type's range (wrapping), floats
are numpy scalars of their dtype so every op rounds as the target does (bf16 is carried
as an f32 rounded to bf16 after each op).
"""

from __future__ import annotations

import math
import struct
from typing import Any, Mapping

import numpy as np

from loomc.dtypes import DTYPES, numpy_type
from loomc.ir import module as ir

# The numpy type holding each float dtype's values exactly (bf16 has none: `_bf16` below).
_FLOAT_NP = {t: numpy_type(DTYPES[t].numpy) for t in ir.FLOAT_DTYPES if DTYPES[t].numpy}


def wrap(value: int, dtype: str) -> int:
    """`value` modulo 2^bits, in the signed or unsigned range of `dtype`."""
    bits = ir.BITS[dtype]
    value &= (1 << bits) - 1
    if not ir.is_unsigned(dtype) and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _bf16(x: float) -> np.float32:
    """Round to bfloat16 (nearest, ties to even), returned as the f32 that holds it."""
    f = np.float32(x)
    if np.isnan(f):
        return f
    bits = int(np.array(f, dtype=np.float32).view(np.uint32))
    bits += 0x7FFF + ((bits >> 16) & 1)
    return np.array((bits >> 16) << 16 & 0xFFFFFFFF, dtype=np.uint32).view(np.float32)[()]


def to_dtype(value: Any, dtype: str) -> Any:
    """Coerce a Python number to the representation of `dtype` (no range check for ints: wraps)."""
    if dtype == "bool":
        return bool(value)
    if ir.is_int(dtype):
        return wrap(int(value), dtype)
    if dtype == "bf16":
        return _bf16(float(value))
    with np.errstate(over="ignore"):
        return _FLOAT_NP[dtype](value)


def evaluate(e: ir.Expr, env: Mapping[str, Any]) -> Any:
    """The value of expression `e`, with `Ref`s looked up in `env` (loads are not scalars)."""
    if isinstance(e, ir.Const):
        return to_dtype(e.value, e.dtype)
    if isinstance(e, ir.Ref):
        return to_dtype(env[e.name], e.dtype)
    if isinstance(e, ir.Unary):
        x = evaluate(e.x, env)
        if e.op == "not":
            return not x
        if e.op == "invert":
            return wrap(~x, e.dtype)
        return wrap(-x, e.dtype) if ir.is_int(e.dtype) else to_dtype(-x, e.dtype)
    if isinstance(e, ir.Binary):
        if e.op == "land":
            return bool(evaluate(e.a, env)) and bool(evaluate(e.b, env))
        if e.op == "lor":
            return bool(evaluate(e.a, env)) or bool(evaluate(e.b, env))
        return _binary(e.op, evaluate(e.a, env), evaluate(e.b, env), e.a.dtype)
    if isinstance(e, ir.Select):
        return evaluate(e.a, env) if evaluate(e.cond, env) else evaluate(e.b, env)
    if isinstance(e, ir.Math):
        return _math(e.fn, [evaluate(a, env) for a in e.args], e.args[0].dtype, e.dtype)
    if isinstance(e, ir.Cast):
        return _cast(evaluate(e.x, env), e.x.dtype, e.dtype)
    if isinstance(e, ir.Bitcast):
        return _bitcast(evaluate(e.x, env), e.x.dtype, e.dtype)
    raise ValueError(f"{type(e).__name__} has no scalar value outside a kernel")


def _binary(op: str, a: Any, b: Any, dtype: str) -> Any:
    if op in ir.COMPARE_OPS:
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[op]
    if ir.is_int(dtype):
        if op == "div":
            if b == 0:
                return 0
            q = abs(a) // abs(b)
            return wrap(q if (a >= 0) == (b >= 0) else -q, dtype)
        if op == "mod":
            if b == 0:
                return 0
            return wrap(a - b * _binary("div", a, b, dtype), dtype)
        if op in ("shl", "shr") and not 0 <= b < ir.BITS[dtype]:
            raise ValueError(f"shift by {b} is undefined for {dtype}")
        value = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "and": lambda: a & b,
                 "or": lambda: a | b, "xor": lambda: a ^ b, "shl": lambda: a << b, "shr": lambda: a >> b}[op]()
        return wrap(value, dtype)
    # floats, in the dtype's precision (bf16 as f32 then rounded)
    x, y = (np.float32(a), np.float32(b)) if dtype == "bf16" else (a, b)
    with np.errstate(all="ignore"):
        if op == "add":
            r = x + y
        elif op == "sub":
            r = x - y
        elif op == "mul":
            r = x * y
        elif op == "div":
            r = x / y
        elif op == "mod":
            r = np.fmod(x, y)
        else:
            raise ValueError(f"{op} is not defined for {dtype}")
    return to_dtype(r, dtype)


def _math(fn: str, args: list[Any], arg_dtype: str, dtype: str) -> Any:
    if fn == "min":
        a, b = args
        return b if b < a else a
    if fn == "max":
        a, b = args
        return b if b > a else a
    if fn == "abs":
        return wrap(abs(args[0]), dtype) if ir.is_int(dtype) else to_dtype(abs(args[0]), dtype)
    if fn == "isnan":
        return bool(np.isnan(args[0]))
    if fn == "isinf":
        return bool(np.isinf(args[0]))
    work = np.float64 if arg_dtype == "f64" else np.float32  # f16/bf16 compute in f32, then round
    xs = [work(a) for a in args]
    with np.errstate(all="ignore"):
        if fn == "rsqrt":
            r = work(1.0) / np.sqrt(xs[0])
        elif fn == "sigmoid":
            r = work(1.0) / (work(1.0) + _exp(-xs[0]))
        elif fn == "exp":
            r = _exp(xs[0])
        elif fn == "erf":
            r = work(math.erf(float(xs[0])))
        elif fn == "fma":
            r = work(float(np.float64(xs[0]) * np.float64(xs[1]) + np.float64(xs[2])))
        elif fn == "pow":
            r = work(_c_pow(float(xs[0]), float(xs[1])))
        else:
            r = getattr(np, fn)(xs[0])
    return to_dtype(r, dtype)


def _exp(x: Any) -> Any:
    """exp as the cpu target computes it: an f32 argument gets the correctly rounded f32 (the
    f64 exp, rounded once; numba_helpers' _lm_exp), an f64 one the f64 exp."""
    return np.float32(np.exp(np.float64(x))) if isinstance(x, np.float32) else np.exp(x)


def _c_pow(x: float, y: float) -> float:
    """C99 `pow` (what numba's math.pow and CUDA's powf compute), including the special cases
    numpy answers differently, e.g. pow(-inf, 0.5) = +inf rather than NaN."""
    odd_integer = math.isfinite(y) and y == int(y) and int(y) % 2 == 1
    if x == 0.0 and y < 0.0:
        return math.copysign(math.inf, x) if odd_integer else math.inf
    try:
        return math.pow(x, y)
    except ValueError:  # a negative finite base with a non-integer exponent
        return math.nan
    except OverflowError:
        return math.copysign(math.inf, x) if odd_integer else math.inf


def _cast(x: Any, src: str, dst: str) -> Any:
    if dst == "bool":
        return bool(x != 0)
    if ir.is_int(dst):
        if ir.is_float(src):
            if not np.isfinite(x):
                raise ValueError(f"cannot convert {x} to {dst}")
            return wrap(int(x), dst)  # int() truncates toward zero
        return wrap(int(x), dst)
    return to_dtype(float(x) if ir.is_float(src) else int(x), dst)


_STRUCT = {"i8": "b", "u8": "B", "i16": "h", "u16": "H", "i32": "i", "u32": "I", "i64": "q", "u64": "Q",
           "f16": "e", "f32": "f", "f64": "d", "bool": "?"}


def _bitcast(x: Any, src: str, dst: str) -> Any:
    if src == "bf16" or dst == "bf16":
        if src == "bf16":
            bits = int(np.array(np.float32(x), dtype=np.float32).view(np.uint32)) >> 16
            return _bitcast(bits, "u16", dst)
        bits = int(_bitcast(x, src, "u16"))
        return np.array(bits << 16, dtype=np.uint32).view(np.float32)[()]
    raw = struct.pack("<" + _STRUCT[src], x if src != "bool" else bool(x))
    out = struct.unpack("<" + _STRUCT[dst], raw)[0]
    return to_dtype(out, dst) if dst != "bool" else bool(out)

"""Shared checker state: the program, its reporter, folded config values, dims and type refs.

The context checkers (`kernels`, `commands`, `control`, `decls`) all go through
this one object, so a config is evaluated once and a name resolves one way.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from loomc.check import types as T
from loomc.check.program import ModuleInfo, Program, Symbol
from loomc.check.shapes import Dim
from loomc.syntax import ast


class ConstError(Exception):
    """A constant expression could not be folded; the diagnostic was already reported."""


class Core:
    def __init__(self, program: Program, overrides: dict[str, Any] | None = None):
        self.program = program
        self.reporter = program.reporter
        self.overrides = overrides or {}
        self._config_values: dict[tuple[str, str], Any] = {}
        self._config_busy: set[tuple[str, str]] = set()

    # ---- reporting ------------------------------------------------------------------

    def error(self, info: ModuleInfo, span: ast.Span, code: str, message: str, notes: tuple[str, ...] = ()) -> None:
        self.reporter.error(info.path, span, code, message, notes)

    def lookup(self, info: ModuleInfo, name: str) -> Symbol | None:
        return info.scope.get(name)

    # ---- configs --------------------------------------------------------------------

    def config_type(self, info: ModuleInfo, cfg: ast.Config) -> T.CheckType | None:
        t = cfg.type
        if isinstance(t, ast.ScalarTypeRef) and t.name in T.NUMERIC_TYPES:
            return T.Scalar(t.name)
        if isinstance(t, ast.DynTypeRef) and t.name == "str":
            return T.Dyn("str")
        return None

    def config_value(self, sym: Symbol) -> Any:
        """The folded value of a config (override applied). Raises ConstError if it cannot be folded."""
        cfg = sym.item
        key = (sym.module.key, cfg.name)
        if key in self._config_values:
            value = self._config_values[key]
            if value is ConstError:
                raise ConstError
            return value
        if key in self._config_busy:
            self.error(sym.module, cfg.name_span, "L0404", f"config '{cfg.name}' depends on itself")
            raise ConstError
        self._config_busy.add(key)
        try:
            if cfg.name in self.overrides:
                value = self.overrides[cfg.name]
            else:
                value, vtype = self.const_eval(sym.module, cfg.value)
                want = self.config_type(sym.module, cfg)
                if want is not None and not self.assignable(vtype, want):
                    raise ConstError
                value = self.coerce(value, want)
        except ConstError:
            self._config_values[key] = ConstError
            raise
        finally:
            self._config_busy.discard(key)
        self._config_values[key] = value
        return value

    @staticmethod
    def coerce(value: Any, want: T.CheckType | None) -> Any:
        """A folded value as its declared type holds it: float configs are rounded to their width,
        so control code and kernels see the same f32 (or f16) value."""
        if isinstance(want, T.Scalar) and want.is_float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return round_float(float(value), want.name)
        return value

    @staticmethod
    def assignable(got: T.CheckType, want: T.CheckType) -> bool:
        if got == want:
            return True
        if isinstance(got, T.Untyped) and isinstance(want, T.Scalar):
            return want.is_float or (got.kind == "int" and want.is_int)
        return False

    def const_eval(self, info: ModuleInfo, e: ast.Expr) -> tuple[Any, T.CheckType]:
        """Fold a constant expression over literals and configs (ints, floats, bools, strings)."""
        if isinstance(e, ast.IntLit):
            return e.value, T.UNTYPED_INT
        if isinstance(e, ast.FloatLit):
            return e.value, T.UNTYPED_FLOAT
        if isinstance(e, ast.BoolLit):
            return e.value, T.BOOL
        if isinstance(e, ast.StrLit):
            return e.value, T.Dyn("str")
        if isinstance(e, ast.Paren):
            return self.const_eval(info, e.inner)
        if isinstance(e, ast.Name):
            sym = self.lookup(info, e.name)
            if sym is None:
                self.error(info, e.span, "L0200", f"unknown name '{e.name}'")
                raise ConstError
            if not isinstance(sym.item, ast.Config):
                self.error(info, e.span, "L0404", f"'{e.name}' is a {sym.kind}, not a constant")
                raise ConstError
            t = self.config_type(sym.module, sym.item)
            if t is None:
                raise ConstError
            return self.config_value(sym), t
        if isinstance(e, ast.Unary):
            v, t = self.const_eval(info, e.operand)
            if e.op == "-" and isinstance(v, (int, float)) and not isinstance(v, bool):
                return -v, t
            if e.op == "!" and isinstance(v, bool):
                return not v, t
            if e.op == "~" and T.is_integral(t):
                return ~v, t
        elif isinstance(e, ast.Binary):
            lv, lt = self.const_eval(info, e.left)
            rv, rt = self.const_eval(info, e.right)
            rtype = self.join_numeric(info, e, lt, rt)
            try:
                return _fold(e.op, lv, rv, rtype), (T.BOOL if e.op in _CMP else rtype)
            except ZeroDivisionError:
                self.error(info, e.span, "L0404", f"constant '{e.op}' divides by zero")
                raise ConstError
            except ValueError as exc:
                self.error(info, e.span, "L0404", f"constant '{e.op}': {exc}")
                raise ConstError
            except TypeError:
                pass
        elif isinstance(e, ast.Call):
            return self.const_call(info, e)
        self.error(info, e.span, "L0404", "expected a constant expression (literals and configs only)")
        raise ConstError

    def const_call(self, info: ModuleInfo, e: ast.Call) -> tuple[Any, T.CheckType]:
        """Conversions (`f32(head_dim)`) and float math (`rsqrt(...)`) fold at specialization."""
        args = [self.const_eval(info, a) for a in e.args]
        callee = e.callee
        if isinstance(callee, ast.TypeName) and callee.name in T.NUMERIC_TYPES and len(args) == 1:
            value, _ = args[0]
            if isinstance(value, (int, float)):
                target = T.Scalar(callee.name)
                if target.is_float:
                    return float(value), target
                if target.is_int and not isinstance(value, bool):
                    return int(value), target
        elif isinstance(callee, ast.Name) and callee.name in _CONST_MATH and self.lookup(info, callee.name) is None:
            fn, arity = _CONST_MATH[callee.name]
            args = [(v, T.UNTYPED_FLOAT if t == T.UNTYPED_INT else t) for v, t in args]
            if len(args) == arity and all(T.is_floating(t) for _, t in args):
                common = next((t for _, t in args if isinstance(t, T.Scalar)), T.UNTYPED_FLOAT)
                if all(self.assignable(t, common) for _, t in args):
                    try:
                        return fn(*(v for v, _ in args)), common
                    except (ValueError, OverflowError, ZeroDivisionError):
                        pass
        self.error(info, e.span, "L0404", "expected a constant expression: literals, configs, conversions "
                                          "and float math (" + ", ".join(sorted(_CONST_MATH)) + ")")
        raise ConstError

    def join_numeric(self, info: ModuleInfo, e: ast.Binary, lt: T.CheckType, rt: T.CheckType) -> T.CheckType:
        """The common type of two operands, or report an implicit-cast error (no conversions happen)."""
        if lt == rt:
            return lt
        if isinstance(lt, T.Untyped) and self.assignable(lt, rt):
            self.literal_fits(info, e.left, rt)
            return rt
        if isinstance(rt, T.Untyped) and self.assignable(rt, lt):
            self.literal_fits(info, e.right, lt)
            return lt
        if isinstance(lt, T.Untyped) and isinstance(rt, T.Untyped):
            return T.UNTYPED_FLOAT
        self.error(info, e.op_span, "L0301",
                   f"operands of '{e.op}' have different types {lt} and {rt}; no implicit casts",
                   notes=("convert one side explicitly, e.g. f32(x)",))
        raise ConstError

    def literal_fits(self, info: ModuleInfo, e: ast.Expr, want: T.CheckType) -> None:
        """An integer literal that meets a typed integer must fit in it (no silent wrap)."""
        literal = int_literal(e)
        if literal is not None and isinstance(want, T.Scalar) and want.is_int:
            lo, hi = T.INT_RANGES[want.name]
            if not lo <= literal <= hi:
                self.error(info, e.span, "L0315", f"integer literal {literal} does not fit in {want}")
                raise ConstError

    # ---- dimensions ---------------------------------------------------------------------

    def dim(self, info: ModuleInfo, e: ast.Expr, symbols: set[str] | None) -> Dim:
        """Evaluate a dimension. `symbols` collects per-call symbols; None means none are allowed."""
        if isinstance(e, ast.IntLit):
            return Dim.const(e.value)
        if isinstance(e, ast.Paren):
            return self.dim(info, e.inner, symbols)
        if isinstance(e, ast.Name):
            sym = self.lookup(info, e.name)
            if sym is None:
                if symbols is None:
                    self.error(info, e.span, "L0200", f"unknown name '{e.name}'",
                               notes=("dimensions here must be integers or config names",))
                    raise ConstError
                symbols.add(e.name)
                return Dim.symbol(e.name)
            if isinstance(sym.item, ast.Config):
                t = self.config_type(sym.module, sym.item)
                value = self.config_value(sym)
                if isinstance(t, T.Scalar) and t.is_int:
                    return Dim.const(value)
                self.error(info, e.span, "L0402", f"config '{e.name}' has type {t}; a dimension must be an integer")
                raise ConstError
            self.error(info, e.span, "L0402", f"'{e.name}' is a {sym.kind}, not a dimension")
            raise ConstError
        if isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "/", "%"):
            a = self.dim(info, e.left, symbols)
            b = self.dim(info, e.right, symbols)
            if e.op == "+":
                return a + b
            if e.op == "-":
                return a - b
            if e.op == "*":
                return a * b
            if b.constant == 0:
                self.error(info, e.span, "L0402", "dimension divides by zero")
                raise ConstError
            return a.divide(b) if e.op == "/" else a.modulo(b)
        self.error(info, e.span, "L0402", "a dimension is an integer, a config name, a per-call symbol "
                                          "or + - * / % of those")
        raise ConstError

    def tensor_type(self, info: ModuleInfo, t: ast.TensorTypeRef, symbols: set[str] | None) -> T.Tensor | None:
        dims = []
        ok = True
        for d in t.dims:
            try:
                value = self.dim(info, d, symbols)
            except ConstError:
                ok = False
                continue
            if value.constant is not None and value.constant <= 0:
                self.error(info, d.span, "L0402", f"dimension must be positive, got {value.constant}")
                ok = False
            dims.append(value)
        if not ok:
            return None
        tensor = T.Tensor(t.dtype, tuple(dims))
        block = T.QUANT_BLOCK.get(t.dtype)
        if block:
            last = dims[-1].constant
            if last is not None and last % block:
                self.error(info, t.dims[-1].span, "L0405",
                           f"{t.dtype} stores blocks of {block} along the last dimension; {last} is not a multiple")
                return None
        panel = T.PANEL_ROWS.get(t.dtype)
        if panel:
            rows = dims[-2].constant if len(dims) >= 2 else None
            if len(dims) < 2 or (rows is not None and rows % panel):
                self.error(info, (t.dims[-2] if len(t.dims) >= 2 else t).span, "L0405",
                           f"{t.dtype} interleaves rows in groups of {panel}: it needs at least two dimensions, "
                           f"and the second-last a multiple of {panel}"
                           + (f"; {rows} is not" if rows is not None else ""))
                return None
        return tensor


_CMP = ("==", "!=", "<", "<=", ">", ">=")

_CONST_MATH = {
    "sqrt": (math.sqrt, 1), "rsqrt": (lambda x: 1.0 / math.sqrt(x), 1), "exp": (math.exp, 1),
    "log": (math.log, 1), "log2": (math.log2, 1), "exp2": (lambda x: 2.0 ** x, 1), "pow": (math.pow, 2),
}


def round_float(value: float, dtype: str) -> float:
    """Round a Python float to f16/bf16/f32 precision (f64 is exact)."""
    if dtype == "f32":
        return struct.unpack("<f", struct.pack("<f", value))[0] if math.isfinite(value) and abs(value) < 3.4e38 else value
    if dtype == "f16":
        try:
            return struct.unpack("<e", struct.pack("<e", value))[0]
        except OverflowError:
            return math.copysign(math.inf, value)
    if dtype == "bf16":
        bits = struct.unpack("<I", struct.pack("<f", round_float(value, "f32")))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return value


def int_literal(e: ast.Expr | None) -> int | None:
    """The value of an integer literal, possibly negated or parenthesised; None for anything else."""
    if isinstance(e, ast.Paren):
        return int_literal(e.inner)
    if isinstance(e, ast.IntLit):
        return e.value
    if isinstance(e, ast.Unary) and e.op == "-":
        inner = int_literal(e.operand)
        return -inner if inner is not None else None
    return None


def _fold(op: str, a: Any, b: Any, t: T.CheckType) -> Any:
    integral = T.is_integral(t)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if integral:
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        return a / b
    if op == "%":
        # Both kinds take the sign of the dividend (C's `%` and `fmod`), as the kernels compute it.
        return a - b * _fold("/", a, b, t) if integral else math.fmod(a, b)
    if op in ("<<", ">>") and integral:
        if not 0 <= b < 64:
            raise ValueError(f"shift count {b} is outside 0..63")
        return a << b if op == "<<" else a >> b
    if op in ("&", "|", "^") and integral:
        return {"&": a & b, "|": a | b, "^": a ^ b}[op]
    if op in ("&&", "||") and isinstance(a, bool):
        return (a and b) if op == "&&" else (a or b)
    if op in _CMP:
        return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    raise TypeError(op)

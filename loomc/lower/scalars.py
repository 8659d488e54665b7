"""Typing and lowering of scalar `.loom` expressions to IR, shared by kernels and commands.

The checker has already accepted the program; this module re-derives each expression's
type with the checker's rules (untyped literals take the type their context needs, see
docs/language.md §4.4) and builds typed IR. Configs fold to `Const`s; a subclass says what
every other name means through `binding(name)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loomc.check import types as T
from loomc.check.core import Core
from loomc.check.intrinsics import KERNEL_MATH
from loomc.check.program import ModuleInfo
from loomc.check.shapes import _OPAQUE, Dim  # opaque atoms keep a symbolic division's operands
from loomc.ir import interpret
from loomc.ir import module as ir
from loomc.syntax import ast

UNTYPED = ("int", "float")  # an integer or float literal that has not met a type yet

BINARY = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "&": "and", "|": "or", "^": "xor",
          "<<": "shl", ">>": "shr", "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne",
          "&&": "land", "||": "lor"}


class LoweringError(Exception):
    """A checked construct that this back end cannot lower; positioned like a diagnostic."""

    def __init__(self, path: str, span: ast.Span, message: str):
        super().__init__(f"{path}:{span.line}:{span.column}: {message}")
        self.path, self.span, self.message = path, span, message


@dataclass(frozen=True)
class Binding:
    """What a name means in the body being lowered.

    kind: "scalar" (`expr` is its IR value), "tensor" (a buffer parameter), "array" (a
    local array). `dims` are IR i64 expressions (tensors) or ints (local arrays)."""

    kind: str
    name: str
    dtype: str
    expr: ir.Expr | None = None
    dims: tuple = ()
    mutable: bool = False
    writable: bool = False
    part: int = -1  # for kernel top-level locals: the part that declares them


def default(t: str) -> str:
    return {"int": "i64", "float": "f32"}.get(t, t)


def join(a: str, b: str) -> str:
    if a == b:
        return a
    if a in UNTYPED and b in UNTYPED:
        return "float"
    return b if a in UNTYPED else a


def const(dtype: str, value: Any) -> ir.Const:
    if dtype == "bool":
        return ir.Const("bool", bool(value))
    if ir.is_int(dtype):
        return ir.Const(dtype, interpret.wrap(int(value), dtype))
    return ir.Const(dtype, float(value))


def fold(e: ir.Expr) -> ir.Expr:
    """Evaluate an expression whose leaves are all constants (integers only: float folding
    would round differently from the target's math library)."""
    if isinstance(e, ir.Const) or not ir.is_int(e.dtype) and e.dtype != "bool":
        return e
    if _all_const(e):
        try:
            return const(e.dtype, interpret.evaluate(e, {}))
        except ValueError:
            return e
    return e


def _all_const(e: ir.Expr) -> bool:
    if isinstance(e, ir.Const):
        return True
    if isinstance(e, (ir.Ref, ir.Load, ir.QuantScale, ir.QuantMin, ir.QuantCode)):
        return False
    return all(_all_const(c) for c in ir.children(e))


def add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if isinstance(b, ir.Const) and b.value == 0:
        return a
    if isinstance(a, ir.Const) and a.value == 0:
        return b
    return fold(ir.Binary("add", a, b, a.dtype))


def mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if isinstance(b, ir.Const) and b.value == 1:
        return a
    if isinstance(a, ir.Const) and a.value == 1:
        return b
    return fold(ir.Binary("mul", a, b, a.dtype))


def i64(value: int) -> ir.Const:
    return ir.Const("i64", value)


def dim_expr(d: Dim) -> ir.Expr:
    """A checker dimension as an i64 IR expression over symbol references."""
    total: ir.Expr = i64(0)
    for monomial, coefficient in d.terms:
        term: ir.Expr = i64(coefficient)
        for name in monomial:
            if name in _OPAQUE:
                op, a, b = _OPAQUE[name]
                factor = fold(ir.Binary("div" if op == "/" else "mod", dim_expr(a), dim_expr(b), "i64"))
            else:
                factor = ir.Ref(name, "i64")
            term = mul(term, factor)
        total = add(total, term)
    return total


def flat_index(indices: list[ir.Expr], dims: tuple[ir.Expr, ...]) -> ir.Expr:
    """Row-major flat index: ((i0 * d1 + i1) * d2 + i2) ..."""
    flat = indices[0]
    for index, d in zip(indices[1:], dims[1:]):
        flat = add(mul(flat, d), index)
    return flat


class ScalarLowerer:
    """Types and lowers expressions of one body; subclasses supply `binding`."""

    def __init__(self, core: Core, info: ModuleInfo):
        self.core = core
        self.info = info

    def binding(self, name: str) -> Binding | None:
        """The local meaning of `name`, or None to fall back to module configs."""
        raise NotImplementedError

    def error(self, span: ast.Span, message: str) -> LoweringError:
        return LoweringError(self.info.path, span, message)

    # ---- names ----------------------------------------------------------------------------

    def name(self, e: ast.Name) -> Binding:
        local = self.binding(e.name)
        if local is not None:
            return local
        sym = self.core.lookup(self.info, e.name)
        if sym is not None and isinstance(sym.item, ast.Config):
            t = self.core.config_type(sym.module, sym.item)
            value = self.core.config_value(sym)
            return Binding("scalar", e.name, t.name, const(t.name, value))
        raise self.error(e.span, f"'{e.name}' cannot be used here")

    # ---- types ----------------------------------------------------------------------------

    def typeof(self, e: ast.Expr) -> str:
        if isinstance(e, ast.IntLit):
            return "int"
        if isinstance(e, ast.FloatLit):
            return "float"
        if isinstance(e, ast.BoolLit):
            return "bool"
        if isinstance(e, ast.Paren):
            return self.typeof(e.inner)
        if isinstance(e, ast.Name):
            return self.name(e).dtype
        if isinstance(e, ast.Unary):
            return "bool" if e.op == "!" else self.typeof(e.operand)
        if isinstance(e, ast.Binary):
            if e.op in ("<<", ">>"):
                lt, rt = self.typeof(e.left), self.typeof(e.right)
                return lt if lt not in UNTYPED else default(rt) if rt in UNTYPED else lt
            if BINARY[e.op] in ir.COMPARE_OPS + ir.LOGIC_OPS:
                return "bool"
            return join(self.typeof(e.left), self.typeof(e.right))
        if isinstance(e, ast.Call):
            callee = e.callee
            if isinstance(callee, ast.TypeName):
                return callee.name
            form, _ = KERNEL_MATH[callee.name]
            if form == "select":
                return default(join(self.typeof(e.args[1]), self.typeof(e.args[2])))
            if form == "predicate":
                return "bool"
            return default(self.common(e))
        if isinstance(e, ast.Index):
            b = self.name(e.base)
            return "f32" if b.dtype in ir.QUANT_DTYPES else b.dtype
        if isinstance(e, ast.Bitcast):
            return e.dtype
        raise self.error(e.span, f"cannot lower {type(e).__name__} here")

    def common(self, e: ast.Call) -> str:
        form, _ = KERNEL_MATH[e.callee.name]
        args = e.args[1:] if form == "select" else e.args
        common = self.typeof(args[0])
        for a in args[1:]:
            common = join(common, self.typeof(a))
        if form in ("float", "predicate") and common == "int":
            common = "float"
        return common

    # ---- lowering ---------------------------------------------------------------------------

    def lower(self, e: ast.Expr, want: str | None = None) -> ir.Expr:
        t = self.typeof(e)
        if t in UNTYPED:
            t = want if want is not None and want not in UNTYPED and want != "bool" else default(t)
        method = getattr(self, "lower_" + type(e).__name__.lower())
        return method(e, t)

    def lower_intlit(self, e: ast.IntLit, t: str) -> ir.Expr:
        return const(t, e.value)

    def lower_floatlit(self, e: ast.FloatLit, t: str) -> ir.Expr:
        return const(t, e.value)

    def lower_boollit(self, e: ast.BoolLit, t: str) -> ir.Expr:
        return ir.Const("bool", e.value)

    def lower_paren(self, e: ast.Paren, t: str) -> ir.Expr:
        return self.lower(e.inner, t)

    def lower_name(self, e: ast.Name, t: str) -> ir.Expr:
        b = self.name(e)
        if b.kind != "scalar":
            raise self.error(e.span, f"'{e.name}' is a tensor; index it")
        return b.expr

    def lower_unary(self, e: ast.Unary, t: str) -> ir.Expr:
        if e.op == "!":
            return ir.Unary("not", self.lower(e.operand, "bool"), "bool")
        x = self.lower(e.operand, t)
        if e.op == "-":
            if isinstance(x, ir.Const) and (ir.is_float(t) or not ir.is_unsigned(t)):
                return const(t, -x.value)
            return ir.Unary("neg", x, t)
        return fold(ir.Unary("invert", x, t))

    def lower_binary(self, e: ast.Binary, t: str) -> ir.Expr:
        op = BINARY[e.op]
        if op in ir.LOGIC_OPS:
            return ir.Binary(op, self.lower(e.left, "bool"), self.lower(e.right, "bool"), "bool")
        if op in ir.COMPARE_OPS:
            ot = default(join(self.typeof(e.left), self.typeof(e.right)))
            return fold(ir.Binary(op, self.lower(e.left, ot), self.lower(e.right, ot), "bool"))
        if op in ("shl", "shr"):
            left = self.lower(e.left, t)
            right = self.lower(e.right, t if self.typeof(e.right) in UNTYPED else None)
            if right.dtype != t:
                right = fold(ir.Cast(right, t))
            return fold(ir.Binary(op, left, right, t))
        return fold(ir.Binary(op, self.lower(e.left, t), self.lower(e.right, t), t))

    def lower_call(self, e: ast.Call, t: str) -> ir.Expr:
        callee = e.callee
        if isinstance(callee, ast.TypeName):
            target = callee.name
            inner = self.typeof(e.args[0])
            if inner in UNTYPED and target != "bool" and (ir.is_float(target) or inner == "int"):
                return self.lower(e.args[0], target)
            x = self.lower(e.args[0])
            return x if x.dtype == target else fold(ir.Cast(x, target))
        name = callee.name
        form, _ = KERNEL_MATH[name]
        if form == "select":
            vt = default(join(self.typeof(e.args[1]), self.typeof(e.args[2])))
            return ir.Select(self.lower(e.args[0], "bool"), self.lower(e.args[1], vt), self.lower(e.args[2], vt), vt)
        ct = default(self.common(e))
        args = tuple(self.lower(a, ct) for a in e.args)
        return ir.Math(name, args, "bool" if form == "predicate" else ct)

    def lower_bitcast(self, e: ast.Bitcast, t: str) -> ir.Expr:
        return ir.Bitcast(self.lower(e.operand), e.dtype)

    def index_value(self, e: ast.Expr) -> ir.Expr:
        x = self.lower(e, "i64" if self.typeof(e) in UNTYPED else None)
        return x if x.dtype == "i64" else fold(ir.Cast(x, "i64"))

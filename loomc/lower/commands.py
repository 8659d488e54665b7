"""A checked command -> `CommandPlan`: the ordered dispatches of one stage, resolved at specialization.

`specialize(checked, name)` unrolls layer loops, decides static `if`s, inlines called
commands and resolves every operand to a `TensorRef` (an argument, result, scratch,
param family member or state, with leading indices selected) or a scalar IR expression
(a folded `Const` when it is known at specialization, else an expression over the
per-call symbols and scalar arguments that the host evaluates per call). Kernels are
lowered to IR once per (module, kernel). The plan is plain data and target-neutral:
`loomc.run.compile.compile_command` pairs it with kernels compiled for a target and returns
the `loomc.run.dispatch.CommandProgram` that runs it.

Symbols: a top-level command's shape symbols are named by their spelling (`T`), and a
state's host dimension by its bracketed scope (`<pages>`). Inside scalar expressions they
appear as `Ref("#T", "i64")`, so they can never meet a scalar argument's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loomc.check import CheckedProgram
from loomc.check import types as T
from loomc.check.commands import motif_decls, motif_module, param_type, state_type
from loomc.check.core import Core
from loomc.check.kernels import shape_symbols, signature
from loomc.check.program import ModuleInfo
from loomc.check.shapes import Dim
from loomc.ir import interpret
from loomc.ir import module as ir
from loomc.lower.kernels import lower_kernel
from loomc.lower.names import FreshNames
from loomc.lower.scalars import Binding, LoweringError, ScalarLowerer, const, dim_expr
from loomc.syntax import ast

SYMBOL_PREFIX = "#"


@dataclass(frozen=True)
class TensorRef:
    """A tensor operand. `dims` are those of the view (after `leading` indices), over the
    top-level symbols. `member` selects a param family member (i64)."""

    kind: str  # "input" | "result" | "scratch" | "param" | "state"
    name: str
    dtype: str
    dims: tuple[Dim, ...]
    member: ir.Expr | None = None
    leading: tuple[ir.Expr, ...] = ()


Operand = TensorRef | ir.Expr


@dataclass(frozen=True)
class Dispatch:
    kind: str  # "kernel" | "motif" (a compiler intrinsic: matmul, matmul_f16, bmm, conv3x3)
    callee: str  # key into CommandPlan.kernels, or the motif name
    operands: tuple[Operand, ...]
    source: ir.Source  # the call site


@dataclass(frozen=True)
class TensorSpec:
    """An argument, result, scratch, param or state: dtype and dims (None for a scalar)."""

    name: str
    dtype: str
    dims: tuple[Dim, ...] | None
    family: tuple[int, int] | None = None  # params: member range start..end


@dataclass
class CommandPlan:
    name: str
    source: ir.Source
    args: tuple[TensorSpec, ...]
    results: tuple[TensorSpec, ...]
    symbols: dict[str, tuple[str, str, int]]  # name -> ("arg" | "state", source name, axis)
    scratch: tuple[TensorSpec, ...]
    dispatches: tuple[Dispatch, ...]
    kernels: dict[str, ir.KernelGroup]
    params: dict[str, TensorSpec] = field(default_factory=dict)
    states: dict[str, TensorSpec] = field(default_factory=dict)


def symbol_ref(name: str) -> ir.Ref:
    return ir.Ref(SYMBOL_PREFIX + name, "i64")


def is_static(e: ir.Expr) -> bool:
    if isinstance(e, ir.Ref):
        return False
    return all(is_static(c) for c in ir.children(e))


def refs_arguments(e: ir.Expr) -> bool:
    """Whether a scalar depends on a per-call scalar argument (not only on symbols)."""
    if isinstance(e, ir.Ref):
        return not e.name.startswith(SYMBOL_PREFIX)
    return any(refs_arguments(c) for c in ir.children(e))


def fold_static(e: ir.Expr) -> ir.Expr:
    if isinstance(e, ir.Const) or not is_static(e):
        return e
    return const(e.dtype, interpret.evaluate(e, {}))


def symbol_dim_expr(d: Dim) -> ir.Expr:
    """A Dim over top-level symbols as an i64 expression over `#symbol` refs."""
    e = dim_expr(d)
    return _prefix(e)


def _prefix(e: ir.Expr) -> ir.Expr:
    if isinstance(e, ir.Ref):
        return symbol_ref(e.name)
    if isinstance(e, ir.Binary):
        return ir.Binary(e.op, _prefix(e.a), _prefix(e.b), e.dtype)
    return e


@dataclass
class _Frame:
    """One command body being specialized: its module, names and symbol bindings."""

    info: ModuleInfo
    names: list[dict[str, Any]]  # scopes: name -> TensorRef | ir.Expr
    symbols: dict[str, Dim]  # this command's symbols -> top-level dims

    def get(self, name: str) -> Any:
        for scope in reversed(self.names):
            if name in scope:
                return scope[name]
        return None


class _Scalars(ScalarLowerer):
    def __init__(self, core: Core, frame: _Frame):
        super().__init__(core, frame.info)
        self.frame = frame

    def binding(self, name: str) -> Binding | None:
        value = self.frame.get(name)
        if isinstance(value, ir.EXPR_KINDS):
            return Binding("scalar", name, value.dtype, value)
        if isinstance(value, TensorRef):
            return Binding("tensor", name, value.dtype)
        if name in self.frame.symbols:
            return Binding("scalar", name, "i64", fold_static(symbol_dim_expr(self.frame.symbols[name])))
        return None


class Specializer:
    def __init__(self, checked: CheckedProgram):
        if not checked.ok:
            raise ValueError("the program has diagnostics; lower only a clean program")
        self.checked = checked
        self.core: Core = checked.core
        self.dispatches: list[Dispatch] = []
        self.scratch: list[TensorSpec] = []
        self.kernels: dict[str, ir.KernelGroup] = {}
        self.params: dict[str, TensorSpec] = {}
        self.states: dict[str, TensorSpec] = {}
        self.scratch_names = FreshNames()
        self.depth = 0

    # ---- top level --------------------------------------------------------------------

    def run(self, info: ModuleInfo, cmd: ast.Command) -> CommandPlan:
        sig = signature(self.core, info, cmd.args + (cmd.results or []), "command")
        n_args = len(cmd.args)
        symbols: dict[str, tuple[str, str, int]] = {}
        for arg, t in sig[:n_args]:
            if isinstance(t, T.Tensor):
                for axis, d in enumerate(t.dims):
                    s = d.bare_symbol
                    if s is not None and s not in symbols:
                        symbols[s] = ("arg", arg.name, axis)
        for name in sorted(shape_symbols(sig)):
            if name not in symbols:
                raise LoweringError(info.path, cmd.name_span, f"symbol '{name}' of command '{cmd.name}' is not a whole "
                                                              "dimension of any argument, so no call can size it")
        frame = _Frame(info, [{}], {s: Dim.symbol(s) for s in symbols})
        args, results = [], []
        for i, (arg, t) in enumerate(sig):
            if isinstance(t, T.Tensor):
                spec = TensorSpec(arg.name, t.dtype, t.dims)
                kind = "input" if i < n_args else "result"
                frame.names[0][arg.name] = TensorRef(kind, arg.name, t.dtype, t.dims)
            else:
                spec = TensorSpec(arg.name, t.name, None)
                frame.names[0][arg.name] = ir.Ref(arg.name, t.name)
            (args if i < n_args else results).append(spec)
        self.body(frame, cmd.body.stmts)
        for state in self.states.values():
            host = state.dims[0].bare_symbol
            if host not in symbols:
                symbols[host] = ("state", state.name, 0)
        return CommandPlan(cmd.name, ir.Source(info.path, cmd.span.line), tuple(args), tuple(results), symbols,
                           tuple(self.scratch), tuple(self.dispatches), self.kernels, self.params, self.states)

    # ---- statements -------------------------------------------------------------------

    def body(self, frame: _Frame, stmts: list) -> None:
        frame.names.append({})
        for s in stmts:
            self.stmt(frame, s)
        frame.names.pop()

    def stmt(self, frame: _Frame, s) -> None:
        if isinstance(s, ast.Var):
            symbols: set[str] = set()
            t = self.core.tensor_type(frame.info, s.type, symbols)
            dims = tuple(d.substitute(frame.symbols) for d in t.dims)
            name = self.scratch_names.fresh(s.name)
            self.scratch.append(TensorSpec(name, t.dtype, dims))
            frame.names[-1][s.name] = TensorRef("scratch", name, t.dtype, dims)
        elif isinstance(s, ast.Let):
            scalars = _Scalars(self.core, frame)
            want = s.type.name if s.type is not None else None
            frame.names[-1][s.name] = fold_static(scalars.lower(s.value, want))
        elif isinstance(s, ast.For):
            lo, _ = self.core.const_eval(frame.info, s.start)
            hi, _ = self.core.const_eval(frame.info, s.end)
            for value in range(lo, hi):
                frame.names.append({s.var: ir.Const("i64", value)})
                self.body(frame, s.body.stmts)
                frame.names.pop()
        elif isinstance(s, ast.If):
            cond = fold_static(_Scalars(self.core, frame).lower(s.cond, "bool"))
            if not isinstance(cond, ir.Const):
                raise LoweringError(frame.info.path, s.cond.span, "a command `if` must be decided at specialization")
            if cond.value:
                self.body(frame, s.then.stmts)
            elif isinstance(s.orelse, ast.If):
                self.stmt(frame, s.orelse)
            elif isinstance(s.orelse, ast.Block):
                self.body(frame, s.orelse.stmts)
        elif isinstance(s, ast.ExprStmt) and isinstance(s.expr, ast.Call):
            self.call(frame, s.expr)
        else:
            raise LoweringError(frame.info.path, s.span, f"{type(s).__name__} cannot be lowered in a command")


    # ---- calls ------------------------------------------------------------------------

    def call(self, frame: _Frame, e: ast.Call) -> None:
        name = e.callee.name
        sym = self.core.lookup(frame.info, name)
        source = ir.Source(frame.info.path, e.span.line)
        if sym is None:
            motif = motif_decls()[name]
            sig = signature(self.core, motif_module(), motif.args, "motif")
            operands = self.operands(frame, e.args, sig)
            self.dispatches.append(Dispatch("motif", name, operands, source))
            return
        item = sym.item
        if isinstance(item, ast.Kernel):
            key = f"{sym.module.key}:{item.name}"
            if key not in self.kernels:
                self.kernels[key] = lower_kernel(self.core, sym.module, item)
            sig = signature(self.core, sym.module, item.args, "kernel")
            self.dispatches.append(Dispatch("kernel", key, self.operands(frame, e.args, sig), source))
            return
        # a command call: inline its body with its arguments and results bound to our operands
        sig = signature(self.core, sym.module, item.args + (item.results or []), "command")
        operands = self.operands(frame, e.args, sig)
        bindings: dict[str, Dim] = {}
        for (decl, want), operand in zip(sig, operands):
            if isinstance(want, T.Tensor):
                for wd, gd in zip(want.dims, operand.dims):
                    s = wd.bare_symbol
                    if s is not None and s not in bindings:
                        bindings[s] = gd
        callee = _Frame(sym.module, [{decl.name: operand for (decl, _), operand in zip(sig, operands)}], bindings)
        self.depth += 1
        if self.depth > 64:
            raise LoweringError(frame.info.path, e.span, f"command calls nest more than 64 deep at '{name}'")
        self.body(callee, item.body.stmts)
        self.depth -= 1

    def operands(self, frame: _Frame, args: list[ast.Expr], sig) -> tuple[Operand, ...]:
        out: list[Operand] = []
        for arg, (decl, want) in zip(args, sig):
            if isinstance(want, T.Tensor):
                out.append(self.tensor(frame, arg))
            else:
                out.append(fold_static(_Scalars(self.core, frame).lower(arg, want.name)))
        return tuple(out)

    def tensor(self, frame: _Frame, e: ast.Expr) -> TensorRef:
        if isinstance(e, ast.Paren):
            return self.tensor(frame, e.inner)
        if isinstance(e, ast.Name):
            local = frame.get(e.name)
            if isinstance(local, TensorRef):
                return local
            sym = self.core.lookup(frame.info, e.name)
            if isinstance(sym.item, ast.Param):
                return TensorRef("param", self.param(sym), *self.param_type(sym))
            if isinstance(sym.item, ast.State):
                return self.state(sym)
        if isinstance(e, ast.Index) and isinstance(e.base, ast.Name):
            scalars = _Scalars(self.core, frame)
            local = frame.get(e.base.name)
            sym = None if local is not None else self.core.lookup(frame.info, e.base.name)
            if sym is not None and isinstance(sym.item, ast.Param) and sym.item.family is not None:
                member = fold_static(scalars.index_value(e.indices[0]))
                name = self.param(sym)
                lo, hi = self.params[name].family
                if isinstance(member, ir.Const) and not lo <= member.value < hi:
                    raise LoweringError(frame.info.path, e.indices[0].span,
                                        f"L0406: index {member.value} is outside family '{e.base.name}', "
                                        f"whose members are {lo}..{hi}")
                return TensorRef("param", name, *self.param_type(sym), member=member)
            base = self.tensor(frame, e.base)
            leading = tuple(fold_static(scalars.index_value(i)) for i in e.indices)
            return TensorRef(base.kind, base.name, base.dtype, base.dims[len(leading):], base.member,
                             base.leading + leading)
        raise LoweringError(frame.info.path, e.span, "expected a tensor operand")

    def param_type(self, sym) -> tuple[str, tuple[Dim, ...]]:
        t = param_type(self.core, sym.module, sym.item)
        return t.dtype, t.dims

    def param(self, sym) -> str:
        item = sym.item
        dtype, dims = self.param_type(sym)
        family = None
        if item.family is not None:
            lo, _ = self.core.const_eval(sym.module, item.family.start)
            hi, _ = self.core.const_eval(sym.module, item.family.end)
            family = (lo, hi)
        spec = TensorSpec(item.name, dtype, dims, family)
        known = self.params.get(item.name)
        if known is not None and known != spec:
            raise LoweringError(sym.module.path, item.name_span, f"two different params are named '{item.name}'; "
                                                                 "the host binds params by name")
        self.params[item.name] = spec
        return item.name

    def state(self, sym) -> TensorRef:
        t = state_type(self.core, sym.module, sym.item)
        spec = TensorSpec(sym.item.name, t.dtype, t.dims)
        known = self.states.get(sym.item.name)
        if known is not None and known != spec:
            raise LoweringError(sym.module.path, sym.item.name_span, f"two different states are named "
                                                                     f"'{sym.item.name}'")
        self.states[sym.item.name] = spec
        return TensorRef("state", sym.item.name, t.dtype, t.dims)


def find_item(checked: CheckedProgram, name: str, kind: type) -> tuple[ModuleInfo, Any]:
    """The item `name` of type `kind`: from the document's sources first, else any module."""
    order = list(checked.roles.get("sources", [])) + checked.modules
    for info in order:
        item = info.decls.get(name)
        if isinstance(item, kind):
            return info, item
    raise KeyError(f"no {kind.__name__.lower()} named '{name}' in the program")


def specialize(checked: CheckedProgram, name: str) -> CommandPlan:
    info, cmd = find_item(checked, name, ast.Command)
    return Specializer(checked).run(info, cmd)

"""Command bodies: the numerical program of a stage, as calls over whole tensors.

A command binds tensors (arguments, results, scratch, params, state) to kernel
and motif calls. Layer loops have constant bounds because they are unrolled at
specialization; calls are shape-checked by unifying the callee's symbols.
"""

from __future__ import annotations

from dataclasses import dataclass

from loomc.check import types as T
from loomc.check.core import ConstError, Core
from loomc.check.intrinsics import COMMAND_MOTIFS_SOURCE, CONTROL_HOST, STATE_SCOPES
from loomc.check.kernels import shape_symbols, signature
from loomc.check.program import ModuleInfo
from loomc.check.scopes import Local, Scopes
from loomc.check.shapes import Dim
from loomc.syntax import ast
from loomc.syntax.parse import parse_module


class CommandError(Exception):
    """Already reported; stops cascading errors from one statement."""


@dataclass
class Callee:
    name: str
    kind: str  # "kernel", "command", "motif"
    args: list[tuple[ast.ArgDecl, T.CheckType | None]]
    num_inputs: int  # the rest are a called command's results, which it writes

    def writes(self, position: int) -> bool:
        decl = self.args[position][0]
        return position >= self.num_inputs or decl.mode in ("out", "inout")


_MOTIFS: dict[str, ast.Stage] | None = None


def motif_decls() -> dict[str, ast.Stage]:
    global _MOTIFS
    if _MOTIFS is None:
        module = parse_module(COMMAND_MOTIFS_SOURCE, "<motifs>")
        _MOTIFS = {item.name: item for item in module.items if isinstance(item, ast.Stage)}
    return _MOTIFS


def motif_module() -> ModuleInfo:
    """The scope intrinsic motif signatures are resolved in: nothing but their own symbols."""
    global _MOTIF_MODULE
    if _MOTIF_MODULE is None:
        _MOTIF_MODULE = ModuleInfo("<motifs>", "<motifs>", parse_module(COMMAND_MOTIFS_SOURCE, "<motifs>"))
    return _MOTIF_MODULE


_MOTIF_MODULE: ModuleInfo | None = None


def param_type(core: Core, info: ModuleInfo, p: ast.Param) -> T.Tensor | None:
    if not isinstance(p.type, ast.TensorTypeRef):
        return None
    try:
        return core.tensor_type(info, p.type, None)
    except ConstError:
        return None


def state_type(core: Core, info: ModuleInfo, s: ast.State) -> T.Tensor | None:
    """State as commands see it: the declared per-unit shape behind the host's scope dimension."""
    if not isinstance(s.type, ast.TensorTypeRef) or s.scope not in STATE_SCOPES:
        return None
    try:
        inner = core.tensor_type(info, s.type, None)
    except ConstError:
        return None
    if inner is None:
        return None
    return T.Tensor(inner.dtype, (Dim.symbol(STATE_SCOPES[s.scope]),) + inner.dims)


class CommandChecker:
    def __init__(self, core: Core, info: ModuleInfo, command: ast.Command):
        self.core = core
        self.info = info
        self.command = command
        self.scopes = Scopes()

    def error(self, span: ast.Span, code: str, message: str, notes: tuple[str, ...] = ()) -> None:
        self.core.error(self.info, span, code, message, notes)

    def run(self) -> None:
        sig = signature(self.core, self.info, self.command.args + (self.command.results or []), "command")
        n_args = len(self.command.args)
        for name in sorted(shape_symbols(sig)):
            self.scopes.declare(name, Local(T.I64, False, "symbol"))
        for i, (arg, t) in enumerate(sig):
            if t is None:
                continue
            if i >= n_args:
                kind = "result"
            else:
                kind = "out" if arg.mode in ("out", "inout") else "arg"
            self.scopes.declare(arg.name, Local(t, False, kind))
        self.block(self.command.body)

    def block(self, b: ast.Block) -> None:
        self.scopes.push()
        for s in b.stmts:
            try:
                self.stmt(s)
            except CommandError:
                pass
        self.scopes.pop()

    def declare(self, name: str, span: ast.Span, local: Local) -> None:
        if self.scopes.declare(name, local) is not None:
            self.error(span, "L0205", f"'{name}' shadows an existing name")

    def stmt(self, s: ast.Stmt) -> None:
        if isinstance(s, ast.ExprStmt):
            if not isinstance(s.expr, ast.Call):
                self.error(s.span, "L0310", "a command statement must be a kernel or motif call")
                raise CommandError
            self.call(s.expr)
        elif isinstance(s, ast.Var):
            if not isinstance(s.type, ast.TensorTypeRef) or s.value is not None:
                self.error(s.span, "L0502", "in a command, `var NAME: DTYPE[...]` declares a scratch tensor "
                                            "and takes no initial value")
                raise CommandError
            symbols: set[str] = set()
            try:
                t = self.core.tensor_type(self.info, s.type, symbols)
            except ConstError:
                raise CommandError
            for sym in sorted(symbols):
                local = self.scopes.get(sym)
                if local is None or local.kind != "symbol":
                    self.error(s.type.span, "L0403", f"scratch dimension '{sym}' is not a config or a shape "
                                                     "symbol of this command's signature")
                    raise CommandError
            if t is not None:
                self.declare(s.name, s.name_span, Local(t, False, "scratch"))
        elif isinstance(s, ast.Let):
            got = self.scalar(s.value)
            t = T.default_type(got)
            if s.type is not None:
                want = T.Scalar(s.type.name) if isinstance(s.type, ast.ScalarTypeRef) else None
                if want is None or want.name in T.QUANT_TYPES:
                    self.error(s.type.span, "L0300", "a command `let` holds a numeric scalar")
                    raise CommandError
                if not self.core.assignable(got, want):
                    self.error(s.value.span, "L0301" if isinstance(got, T.Scalar) else "L0300",
                               f"expected {want}, got {got}")
                    raise CommandError
                t = want
            static = self.is_static(s.value)
            self.declare(s.name, s.name_span, Local(t, False, "let", value="static" if static else None))
        elif isinstance(s, ast.For):
            self.for_loop(s)
        elif isinstance(s, ast.If):
            self.const_condition(s.cond)
            self.block(s.then)
            if s.orelse is not None:
                self.stmt(s.orelse) if isinstance(s.orelse, ast.If) else self.block(s.orelse)
        else:
            self.error(s.span, "L0502", f"{_stmt_name(s)} cannot appear in a command",
                       notes=("commands launch kernels and motifs; loops over layers use `for` with constant bounds",))

    def for_loop(self, s: ast.For) -> None:
        if s.end is None:
            self.error(s.start.span, "L0502", "command loops run over constant ranges `a..b`")
            raise CommandError
        bounds = []
        for bound in (s.start, s.end):
            local = next((n for n in _names(bound) if self.scopes.get(n) is not None), None)
            if local is not None:
                self.error(bound.span, "L0404", f"command loops are unrolled, so bounds must be constants; "
                                                f"'{local}' is known only at run time")
                raise CommandError
            try:
                value, t = self.core.const_eval(self.info, bound)
            except ConstError:
                raise CommandError
            if not T.is_integral(t):
                self.error(bound.span, "L0300", f"loop bounds are integers, got {t}")
                raise CommandError
            bounds.append(value)
        self.scopes.push()
        # The loop variable is a constant in every unrolled copy; remember its range for index checks.
        self.declare(s.var, s.var_span, Local(T.I64, False, "loop", value=tuple(bounds)))
        self.block(s.body)
        self.scopes.pop()

    def const_condition(self, e: ast.Expr) -> None:
        """A command `if` is decided at specialization: configs, literals and unrolled loop variables only."""
        runtime = next((n for n in _names(e) if not self.is_static(ast.Name(n))), None)
        if runtime is not None:
            self.error(e.span, "L0404", f"a command `if` is decided when the program is specialized; "
                                        f"'{runtime}' is known only at run time")
            raise CommandError
        t = self.scalar(e)
        if t != T.BOOL:
            self.error(e.span, "L0308", f"condition must be bool, got {t}")

    def is_static(self, e: ast.Expr) -> bool:
        """Known at specialization: every name is a config, an unrolled loop variable or a static let."""
        for name in _names(e):
            local = self.scopes.get(name)
            if local is not None and not (local.kind == "loop" or (local.kind == "let" and local.value == "static")):
                return False
        return True

    # ---- operands ------------------------------------------------------------------

    def scalar(self, e: ast.Expr) -> T.CheckType:
        """Scalar operands: literals, configs, scalar args, loop variables and arithmetic on them."""
        if isinstance(e, (ast.IntLit,)):
            return T.UNTYPED_INT
        if isinstance(e, ast.FloatLit):
            return T.UNTYPED_FLOAT
        if isinstance(e, ast.BoolLit):
            return T.BOOL
        if isinstance(e, ast.Paren):
            return self.scalar(e.inner)
        if isinstance(e, ast.Name):
            local = self.scopes.get(e.name)
            if local is not None:
                if isinstance(local.type, T.Tensor):
                    self.error(e.span, "L0300", f"expected a scalar, got tensor '{e.name}' ({local.type})")
                    raise CommandError
                return local.type
            sym = self.core.lookup(self.info, e.name)
            if sym is None:
                self.error(e.span, "L0200", f"unknown name '{e.name}'")
                raise CommandError
            if isinstance(sym.item, ast.Config):
                t = self.core.config_type(sym.module, sym.item)
                if isinstance(t, T.Scalar):
                    return t
            self.error(e.span, "L0300", f"expected a scalar, got {sym.kind} '{e.name}'")
            raise CommandError
        if isinstance(e, ast.Binary) and e.op in ("&&", "||"):
            for side in (e.left, e.right):
                if self.scalar(side) != T.BOOL:
                    self.error(side.span, "L0300", f"'{e.op}' takes bool operands")
                    raise CommandError
            return T.BOOL
        if isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">="):
            lt, rt = self.scalar(e.left), self.scalar(e.right)
            try:
                t = self.core.join_numeric(self.info, e, lt, rt)
            except ConstError:
                raise CommandError
            return T.BOOL if e.op in ("==", "!=", "<", "<=", ">", ">=") else t
        if isinstance(e, ast.Unary) and e.op == "-":
            return self.scalar(e.operand)
        if isinstance(e, ast.Unary) and e.op == "!":
            if self.scalar(e.operand) != T.BOOL:
                self.error(e.span, "L0314", "'!' takes a bool")
                raise CommandError
            return T.BOOL
        if isinstance(e, ast.Call) and isinstance(e.callee, ast.TypeName) and len(e.args) == 1:
            self.scalar(e.args[0])
            return T.Scalar(e.callee.name)
        self.error(e.span, "L0502", "commands pass tensors and scalar values; compute elementwise in a kernel")
        raise CommandError

    def tensor(self, e: ast.Expr) -> tuple[T.Tensor, bool]:
        """A tensor operand and whether the command may write it."""
        if isinstance(e, ast.Name):
            local = self.scopes.get(e.name)
            if local is not None:
                if not isinstance(local.type, T.Tensor):
                    self.error(e.span, "L0300", f"expected a tensor, got {local.kind} '{e.name}' of type {local.type}")
                    raise CommandError
                return local.type, local.kind in ("out", "result", "scratch")
            sym = self.core.lookup(self.info, e.name)
            if sym is None:
                self.error(e.span, "L0200", f"unknown name '{e.name}'")
                raise CommandError
            if isinstance(sym.item, ast.Param):
                if sym.item.family is not None:
                    self.error(e.span, "L0306", f"'{e.name}' is a family of params; select one, e.g. {e.name}[l]")
                    raise CommandError
                t = param_type(self.core, sym.module, sym.item)
                if t is None:
                    raise CommandError
                return t, False
            if isinstance(sym.item, ast.State):
                t = state_type(self.core, sym.module, sym.item)
                if t is None:
                    raise CommandError
                return t, True
            self.error(e.span, "L0300", f"expected a tensor, got {sym.kind} '{e.name}'")
            raise CommandError
        if isinstance(e, ast.Index) and isinstance(e.base, ast.Name):
            sym = None if self.scopes.get(e.base.name) else self.core.lookup(self.info, e.base.name)
            if sym is not None and isinstance(sym.item, ast.Param) and sym.item.family is not None:
                if len(e.indices) != 1:
                    self.error(e.span, "L0306", f"param family '{e.base.name}' takes one index")
                    raise CommandError
                self.index_value(e.indices[0])
                self.family_member(sym, e.indices[0])
                t = param_type(self.core, sym.module, sym.item)
                if t is None:
                    raise CommandError
                return t, False
            base, writable = self.tensor(e.base)
            if len(e.indices) >= base.rank:
                self.error(e.span, "L0502", f"'{e.base.name}' has {base.rank} dimensions; a command may select "
                                            f"at most {base.rank - 1} leading ones (elements are read in kernels)")
                raise CommandError
            for i in e.indices:
                self.index_value(i)
            return T.Tensor(base.dtype, base.dims[len(e.indices):]), writable
        if isinstance(e, ast.Paren):
            return self.tensor(e.inner)
        self.error(e.span, "L0300", "expected a tensor operand")
        raise CommandError

    def family_member(self, sym, index: ast.Expr) -> None:
        """A family `w[l in a..b]` has members a..b-1; a constant or unrolled-loop index must stay inside."""
        family = sym.item.family
        try:
            lo, _ = self.core.const_eval(sym.module, family.start)
            hi, _ = self.core.const_eval(sym.module, family.end)
        except ConstError:
            return
        local = self.scopes.get(index.name) if isinstance(index, ast.Name) else None
        if local is not None and local.kind == "loop" and isinstance(local.value, tuple):
            first, stop = local.value
        elif any(self.scopes.get(n) is not None for n in _names(index)):
            # An expression of loop variables or lets (`w[l + 1]`, perhaps under `if l + 1 <
            # layers`): its values are known once loops unroll and ifs are decided, so
            # specialization checks each member (L0406 there).
            return
        elif self.is_static(index):
            try:
                first, _ = self.core.const_eval(self.info, index)
            except ConstError:
                raise CommandError
            stop = first + 1
        else:
            return
        if first < lo or stop > hi:
            shown = f"{first}..{stop}" if stop != first + 1 else str(first)
            self.error(index.span, "L0406", f"index {shown} is outside family '{sym.item.name}', "
                                            f"whose members are {lo}..{hi}")
            raise CommandError

    def index_value(self, e: ast.Expr) -> None:
        t = self.scalar(e)
        if not T.is_integral(t):
            self.error(e.span, "L0300", f"indices are integers, got {t}")
            raise CommandError

    # ---- calls -------------------------------------------------------------------

    def callee(self, e: ast.Call) -> Callee:
        if not isinstance(e.callee, ast.Name):
            self.error(e.callee.span, "L0303", "commands call kernels, commands and motifs by name")
            raise CommandError
        name = e.callee.name
        sym = self.core.lookup(self.info, name)
        if sym is None:
            motif = motif_decls().get(name)
            if motif is not None:
                # Resolved in the motifs' own empty scope: a caller's config named M, K or N must not capture them.
                return Callee(name, "motif", signature(self.core, motif_module(), motif.args, "motif"), len(motif.args))
            if name in CONTROL_HOST:
                self.error(e.callee.span, "L0502", f"'{name}' is control code; it belongs in a `fn`")
            else:
                self.error(e.callee.span, "L0200", f"unknown kernel or command '{name}'")
            raise CommandError
        item = sym.item
        if isinstance(item, ast.Kernel):
            return Callee(name, "kernel", signature(self.core, sym.module, item.args, "kernel"), len(item.args))
        if isinstance(item, ast.Command):
            return Callee(name, "command", signature(self.core, sym.module, item.args + (item.results or []), "command"),
                          len(item.args))
        self.error(e.callee.span, "L0303", f"'{name}' is a {sym.kind}; commands call kernels, commands and motifs")
        raise CommandError

    def call(self, e: ast.Call) -> None:
        callee = self.callee(e)
        if len(e.args) != len(callee.args):
            self.error(e.span, "L0302", f"{callee.kind} '{callee.name}' takes {len(callee.args)} arguments, "
                                        f"got {len(e.args)}")
            raise CommandError
        bindings: dict[str, Dim] = {}
        operands: list[tuple[ast.Expr, ast.ArgDecl, T.CheckType | None, T.CheckType]] = []
        for position, (arg_expr, (decl, want)) in enumerate(zip(e.args, callee.args)):
            if want is None:
                raise CommandError  # the callee's own signature is broken; reported there
            if isinstance(want, T.Tensor):
                got, writable = self.tensor(arg_expr)
                if callee.writes(position) and not writable:
                    self.error(arg_expr.span, "L0305", f"'{decl.name}' of {callee.name} is written; "
                                                       f"pass a result, scratch or state tensor, not an input or param")
                    raise CommandError
                if got.dtype != want.dtype:
                    self.error(arg_expr.span, "L0300", f"'{decl.name}' of {callee.name} expects {want.dtype}, got {got.dtype}")
                    raise CommandError
                if got.rank != want.rank:
                    self.error(arg_expr.span, "L0401", f"'{decl.name}' of {callee.name} expects {want.rank} dimensions "
                                                       f"({want}), got {got.rank} ({got})")
                    raise CommandError
                for wd, gd in zip(want.dims, got.dims):
                    sym = wd.bare_symbol
                    if sym is not None and sym not in bindings and not sym.startswith("("):
                        bindings[sym] = gd
                operands.append((arg_expr, decl, got, want))
            else:
                got = self.scalar(arg_expr)
                if not self.core.assignable(got, want):
                    code = "L0301" if isinstance(got, T.Scalar) and got != T.BOOL and want != T.BOOL else "L0300"
                    self.error(arg_expr.span, code, f"'{decl.name}' of {callee.name} expects {want}, got {got}"
                               + ("; no implicit casts" if code == "L0301" else ""))
                    raise CommandError
        for arg_expr, decl, got, want in operands:
            for axis, (wd, gd) in enumerate(zip(want.dims, got.dims)):
                expected = wd.substitute(bindings)
                unbound = {s for s in expected.symbols() if s in wd.symbols() and s not in bindings}
                if unbound:
                    self.error(arg_expr.span, "L0403", f"cannot infer {', '.join(sorted(unbound))} for "
                                                       f"{callee.name}: no argument gives it directly")
                    raise CommandError
                if expected != gd:
                    self.error(arg_expr.span, "L0400",
                               f"dimension {axis} of '{decl.name}' in {callee.name}: expected {expected} "
                               f"(from {wd}), got {gd}")
                    raise CommandError


def _names(e: ast.Expr) -> list[str]:
    if isinstance(e, ast.Name):
        return [e.name]
    if isinstance(e, ast.Binary):
        return _names(e.left) + _names(e.right)
    if isinstance(e, (ast.Unary, ast.Paren)):
        return _names(e.operand if isinstance(e, ast.Unary) else e.inner)
    return []


def _stmt_name(s: ast.Stmt) -> str:
    return {
        "Assign": "assignment", "While": "`while`", "Return": "`return`", "Break": "`break`",
        "Continue": "`continue`", "ParallelFor": "`parallel for`", "Expect": "`expect`",
    }.get(type(s).__name__, "this statement")

"""Kernel bodies: loop-level numeric code over scalars and typed tensor views.

A kernel sees its arguments, shape symbols, configs and its own locals — no
params, state, fns or other kernels — and has no dynamic values, so the
lowering can emit numba and CUDA from the same form.
"""

from __future__ import annotations

from loomc.check import types as T
from loomc.check.core import ConstError, Core, int_literal
from loomc.check.intrinsics import CONTROL_HOST, KERNEL_MATH
from loomc.check.program import ModuleInfo
from loomc.check.scopes import Local, Scopes
from loomc.check.shapes import Dim
from loomc.syntax import ast


class KernelError(Exception):
    """An expression failed to type; already reported. Stops cascading errors from one expression."""


def signature(core: Core, info: ModuleInfo, args: list[ast.ArgDecl], what: str) -> list[tuple[ast.ArgDecl, T.CheckType | None]] | None:
    """Resolve an argument list of a kernel, command or stage. Unknown dims become per-call symbols."""
    out: list[tuple[ast.ArgDecl, T.CheckType | None]] = []
    seen: dict[str, ast.ArgDecl] = {}
    symbols: set[str] = set()
    for arg in args:
        if arg.name in seen:
            core.error(info, arg.span, "L0201", f"argument '{arg.name}' is already declared")
        seen[arg.name] = arg
        t = arg.type
        resolved: T.CheckType | None = None
        if isinstance(t, ast.TensorTypeRef):
            try:
                resolved = core.tensor_type(info, t, symbols)
            except ConstError:
                resolved = None
        elif isinstance(t, ast.ScalarTypeRef):
            if t.name in T.QUANT_TYPES:
                core.error(info, t.span, "L0307", f"{t.name} is a block storage type; only tensors can hold it")
            else:
                resolved = T.Scalar(t.name)
            if arg.mode is not None:
                core.error(info, arg.span, "L0305", f"'{arg.mode}' applies to tensors; scalar '{arg.name}' is passed by value")
        else:
            core.error(info, t.span, "L0300", f"{what} arguments are numeric scalars or tensors, not '{t.name}'")
        out.append((arg, resolved))
    return out


def shape_symbols(sig: list[tuple[ast.ArgDecl, T.CheckType | None]]) -> set[str]:
    names: set[str] = set()
    for _, t in sig:
        if isinstance(t, T.Tensor):
            for d in t.dims:
                names |= d.symbols()
    return names


class KernelChecker:
    def __init__(self, core: Core, info: ModuleInfo, kernel: ast.Kernel):
        self.core = core
        self.info = info
        self.kernel = kernel
        self.scopes = Scopes()
        self.loop_depth = 0

    def error(self, span: ast.Span, code: str, message: str, notes: tuple[str, ...] = ()) -> None:
        self.core.error(self.info, span, code, message, notes)

    def run(self) -> None:
        sig = signature(self.core, self.info, self.kernel.args, "kernel")
        for name in sorted(shape_symbols(sig)):
            self.scopes.declare(name, Local(T.I64, False, "symbol"))
        for arg, t in sig:
            if t is None:
                continue
            kind = "out" if arg.mode in ("out", "inout") else "arg"
            self.scopes.declare(arg.name, Local(t, False, kind))
        self.block(self.kernel.body, top=True)

    # ---- statements ------------------------------------------------------------------

    def block(self, b: ast.Block, top: bool = False) -> None:
        self.scopes.push()
        for s in b.stmts:
            self.stmt(s, top)
        self.scopes.pop()

    def stmt(self, s: ast.Stmt, top: bool = False) -> None:
        try:
            getattr(self, "stmt_" + type(s).__name__.lower())(s, top)
        except KernelError:
            pass

    def declare(self, name: str, span: ast.Span, local: Local) -> None:
        existing = self.scopes.declare(name, local)
        if existing is not None:
            self.error(span, "L0205", f"'{name}' shadows an existing {existing.kind} of the same name")

    def local_type(self, t: ast.TypeRef | None, span: ast.Span) -> T.CheckType | None:
        if t is None:
            return None
        if isinstance(t, ast.ScalarTypeRef):
            if t.name in T.QUANT_TYPES:
                self.error(t.span, "L0307", f"{t.name} is a block storage type; a local cannot hold it")
                raise KernelError
            return T.Scalar(t.name)
        if isinstance(t, ast.TensorTypeRef):
            try:
                tensor = self.core.tensor_type(self.info, t, None)
            except ConstError:
                raise KernelError
            if tensor is None:
                raise KernelError
            if tensor.dtype in T.QUANT_TYPES:
                self.error(t.span, "L0307", f"a local array cannot be {tensor.dtype}")
                raise KernelError
            return tensor
        self.error(t.span, "L0500", f"'{t.name}' is a control type; kernels use numeric types")
        raise KernelError

    def initial(self, want: T.CheckType | None, value: ast.Expr) -> T.CheckType:
        """The type a new local gets. A bad initializer is reported, but the name is still declared
        (with its annotated type when there is one) so later uses do not cascade into 'unknown name'."""
        try:
            got = self.expr(value)
        except KernelError:
            return want if want is not None else T.F32
        t = want or T.default_type(got)
        try:
            return self.expect(got, t, value.span, value)
        except KernelError:
            return t

    def stmt_let(self, s: ast.Let, top: bool) -> None:
        want = self.local_type(s.type, s.span)
        if isinstance(want, T.Tensor):
            self.error(s.type.span, "L0300", "a `let` holds a scalar; declare local arrays with `var`")
            raise KernelError
        t = self.initial(want, s.value)
        self.declare(s.name, s.name_span, Local(t, False, "let"))

    def stmt_var(self, s: ast.Var, top: bool) -> None:
        want = self.local_type(s.type, s.span)
        if isinstance(want, T.Tensor):
            if s.value is not None:
                self.error(s.value.span, "L0300", "a local array starts zeroed; it takes no initial value")
            self.declare(s.name, s.name_span, Local(want, True, "var"))
            return
        if s.value is None:
            if want is None:
                self.error(s.name_span, "L0300", f"'{s.name}' needs a type or an initial value")
                raise KernelError
            t = want
        else:
            t = self.initial(want, s.value)
        self.declare(s.name, s.name_span, Local(t, True, "var"))

    def stmt_assign(self, s: ast.Assign, top: bool) -> None:
        target = s.target
        if isinstance(target, ast.Name):
            local = self.scopes.get(target.name)
            if local is None:
                self.name(target)  # reports unknown / not allowed
                raise KernelError
            if not local.mutable or isinstance(local.type, T.Tensor):
                self.error(target.span, "L0304", f"cannot assign to {local.kind} '{target.name}'",
                           notes=("only `var` locals and elements of out/inout tensors are assignable",))
                raise KernelError
            want = local.type
        elif isinstance(target, ast.Index):
            want = self.index(target, write=True)
        else:
            self.error(target.span, "L0309", "cannot assign to this expression")
            raise KernelError
        got = self.expr(s.value)
        if s.op != "=":
            self.check_operator(s.op[:-1], want, s.span)
        if s.op in ("<<=", ">>="):
            if not T.is_integral(got):  # a shift count is any integer, as in `x = x << n`
                self.error(s.value.span, "L0314", f"shift counts are integers, got {got}")
                raise KernelError
            return
        self.expect(got, want, s.value.span, s.value)

    def stmt_exprstmt(self, s: ast.ExprStmt, top: bool) -> None:
        self.expr(s.expr)
        self.error(s.span, "L0310", "this expression's value is unused; kernels act only by writing tensors")

    def stmt_if(self, s: ast.If, top: bool) -> None:
        self.condition(s.cond)
        self.block(s.then)
        if isinstance(s.orelse, ast.Block):
            self.block(s.orelse)
        elif isinstance(s.orelse, ast.If):
            self.stmt_if(s.orelse, top)

    def bound_type(self, start: ast.Expr, end: ast.Expr) -> T.CheckType:
        a, b = self.expr(start), self.expr(end)
        for e, t in ((start, a), (end, b)):
            if not T.is_integral(t):
                self.error(e.span, "L0300", f"loop bounds are integers, got {t}")
                raise KernelError
        if a != b and not (isinstance(a, T.Untyped) or isinstance(b, T.Untyped)):
            self.error(end.span, "L0301", f"loop bounds have different types {a} and {b}; no implicit casts")
            raise KernelError
        return T.default_type(b if isinstance(a, T.Untyped) else a)

    def stmt_for(self, s: ast.For, top: bool) -> None:
        if s.end is None:
            self.error(s.start.span, "L0500", "kernels loop over ranges `a..b`, not over lists")
            raise KernelError
        t = self.bound_type(s.start, s.end)
        self.loop(s.body, [(s.var, s.var_span, t)])

    def stmt_parallelfor(self, s: ast.ParallelFor, top: bool) -> None:
        if not top:
            self.error(s.span, "L0503", "`parallel for` must be a top-level statement of its kernel",
                       notes=("only the outermost loop runs in parallel; write inner loops as `for`",))
        binds = [(b.var, b.span, self.bound_type(b.start, b.end)) for b in s.binds]
        self.loop(s.body, binds, parallel=True)

    def loop(self, body: ast.Block, binds, parallel: bool = False) -> None:
        self.scopes.push()
        for name, span, t in binds:
            self.declare(name, span, Local(t, False, "loop"))
        depth = self.loop_depth
        self.loop_depth = 0 if parallel else depth + 1
        self.block(body)
        self.loop_depth = depth
        self.scopes.pop()

    def stmt_while(self, s: ast.While, top: bool) -> None:
        self.condition(s.cond)
        self.loop_depth += 1
        self.block(s.body)
        self.loop_depth -= 1

    def stmt_return(self, s: ast.Return, top: bool) -> None:
        self.error(s.span, "L0505", "kernels do not return; they write their out/inout tensors")

    def stmt_break(self, s, top: bool) -> None:
        if not self.loop_depth:
            self.error(s.span, "L0504", f"'{'break' if isinstance(s, ast.Break) else 'continue'}' outside a sequential loop")

    stmt_continue = stmt_break

    def stmt_expect(self, s: ast.Expect, top: bool) -> None:
        self.error(s.span, "L0500", "`expect` belongs in check blocks")

    def condition(self, e: ast.Expr) -> None:
        t = self.expr(e)
        if t != T.BOOL:
            self.error(e.span, "L0308", f"condition must be bool, got {t}")

    # ---- expressions ---------------------------------------------------------------------

    def expect(self, got: T.CheckType, want: T.CheckType, span: ast.Span, value: ast.Expr | None = None) -> T.CheckType:
        if self.core.assignable(got, want):
            literal = int_literal(value)
            if literal is not None and isinstance(want, T.Scalar) and want.is_int:
                lo, hi = T.INT_RANGES[want.name]
                if not lo <= literal <= hi:
                    self.error(span, "L0315", f"integer literal {literal} does not fit in {want}")
                    raise KernelError
            return want
        if isinstance(got, T.Scalar) and isinstance(want, T.Scalar) and got != want and got.name != "bool" and want.name != "bool":
            self.error(span, "L0301", f"expected {want}, got {got}; no implicit casts",
                       notes=(f"convert explicitly: {want}(...)",))
        else:
            self.error(span, "L0300", f"expected {want}, got {got}")
        raise KernelError

    def expr(self, e: ast.Expr) -> T.CheckType:
        method = getattr(self, "expr_" + type(e).__name__.lower(), None)
        if method is None:
            self.error(e.span, "L0500", f"{_describe(e)} cannot appear in a kernel")
            raise KernelError
        return method(e)

    def expr_intlit(self, e: ast.IntLit) -> T.CheckType:
        return T.UNTYPED_INT

    def expr_floatlit(self, e: ast.FloatLit) -> T.CheckType:
        return T.UNTYPED_FLOAT

    def expr_boollit(self, e: ast.BoolLit) -> T.CheckType:
        return T.BOOL

    def expr_paren(self, e: ast.Paren) -> T.CheckType:
        return self.expr(e.inner)

    def expr_name(self, e: ast.Name) -> T.CheckType:
        return self.name(e)

    def name(self, e: ast.Name) -> T.CheckType:
        local = self.scopes.get(e.name)
        if local is not None:
            if isinstance(local.type, T.Tensor):
                self.error(e.span, "L0300", f"tensor '{e.name}' used as a value; index it, e.g. {e.name}[i]")
                raise KernelError
            return local.type
        sym = self.core.lookup(self.info, e.name)
        if sym is None:
            self.error(e.span, "L0200", f"unknown name '{e.name}'")
            raise KernelError
        if isinstance(sym.item, ast.Config):
            t = self.core.config_type(sym.module, sym.item)
            if not isinstance(t, T.Scalar):
                self.error(e.span, "L0500", f"config '{e.name}' has type {t}; kernels use numeric configs only")
                raise KernelError
            try:
                self.core.config_value(sym)
            except ConstError:
                raise KernelError
            return t
        self.error(e.span, "L0500", f"a kernel cannot use {sym.kind} '{e.name}'; pass it as an argument",
                   notes=("kernels see their arguments, shape symbols, configs and locals",))
        raise KernelError

    def expr_unary(self, e: ast.Unary) -> T.CheckType:
        t = self.expr(e.operand)
        if e.op == "!" and t == T.BOOL:
            return t
        if e.op == "-" and (T.is_integral(t) or T.is_floating(t)):
            return t
        if e.op == "~" and T.is_integral(t):
            return t
        self.error(e.span, "L0314", f"operator '{e.op}' is not defined for {t}")
        raise KernelError

    def check_operator(self, op: str, t: T.CheckType, span: ast.Span) -> None:
        numeric = T.is_integral(t) or T.is_floating(t)
        ok = {
            "+": numeric, "-": numeric, "*": numeric, "/": numeric, "%": numeric,
            "&": T.is_integral(t), "|": T.is_integral(t), "^": T.is_integral(t),
            "<<": T.is_integral(t), ">>": T.is_integral(t),
            "&&": t == T.BOOL, "||": t == T.BOOL,
            "<": numeric, "<=": numeric, ">": numeric, ">=": numeric,
            "==": True, "!=": True,
        }[op]
        if not ok:
            self.error(span, "L0314", f"operator '{op}' is not defined for {t}")
            raise KernelError

    def expr_binary(self, e: ast.Binary) -> T.CheckType:
        lt = self.expr(e.left)
        rt = self.expr(e.right)
        if e.op in ("<<", ">>"):
            for side, t in ((e.left, lt), (e.right, rt)):
                if not T.is_integral(t):
                    self.error(side.span, "L0314", f"shift operands are integers, got {t}")
                    raise KernelError
            return lt  # a shift has its left operand's type; `1 << 2` stays an untyped constant
        try:
            t = self.core.join_numeric(self.info, e, lt, rt)
        except ConstError:
            raise KernelError
        self.check_operator(e.op, t, e.op_span)
        return T.BOOL if e.op in ("==", "!=", "<", "<=", ">", ">=") else t

    def expr_bitcast(self, e: ast.Bitcast) -> T.CheckType:
        t = T.default_type(self.expr(e.operand))
        if e.dtype in T.QUANT_TYPES or not isinstance(t, T.Scalar):
            self.error(e.span, "L0313", f"cannot bitcast {t} to {e.dtype}")
            raise KernelError
        if T.BITS[t.name] != T.BITS[e.dtype]:
            self.error(e.span, "L0313", f"bitcast needs equal widths: {t} is {T.BITS[t.name]} bits, "
                                        f"{e.dtype} is {T.BITS[e.dtype]} bits")
            raise KernelError
        return T.Scalar(e.dtype)

    def expr_index(self, e: ast.Index) -> T.CheckType:
        return self.index(e, write=False)

    def index(self, e: ast.Index, write: bool) -> T.CheckType:
        if not isinstance(e.base, ast.Name):
            self.error(e.base.span, "L0300", "only tensor arguments and local arrays can be indexed")
            raise KernelError
        local = self.scopes.get(e.base.name)
        if local is None or not isinstance(local.type, T.Tensor):
            if local is None:
                self.name(e.base)
            self.error(e.base.span, "L0300", f"'{e.base.name}' is not a tensor and cannot be indexed")
            raise KernelError
        tensor: T.Tensor = local.type
        if len(e.indices) != tensor.rank:
            self.error(e.span, "L0306", f"'{e.base.name}' has {tensor.rank} dimensions; "
                                        f"indexing gives {len(e.indices)}")
            raise KernelError
        for i in e.indices:
            t = self.expr(i)
            if not T.is_integral(t):
                self.error(i.span, "L0300", f"tensor indices are integers, got {t}")
                raise KernelError
        if write:
            if local.kind not in ("out", "var"):
                self.error(e.base.span, "L0305", f"'{e.base.name}' is an input; only out/inout tensors are written",
                           notes=(f"declare it as `out {e.base.name}: ...` or `inout {e.base.name}: ...`",))
                raise KernelError
            if tensor.dtype in T.QUANT_TYPES:
                self.error(e.span, "L0307", f"{tensor.dtype} tensors are read-only in kernels")
                raise KernelError
        if tensor.dtype in T.PANEL_ROWS:
            self.error(e.span, "L0307", f"{tensor.dtype} interleaves its rows in panels: kernels cannot index it "
                                        f"(the integer-dot motif reads it)")
            raise KernelError
        if tensor.dtype in T.QUANT_TYPES:
            return T.F32  # typed indexing of block storage dequantizes the element
        return T.Scalar(tensor.dtype)

    def expr_call(self, e: ast.Call) -> T.CheckType:
        callee = e.callee
        if isinstance(callee, ast.TypeName):
            if callee.name in T.QUANT_TYPES:
                self.error(callee.span, "L0307", f"'{callee.name}' is a block storage type; it has no scalar "
                                                 "conversion (indexing a tensor of it gives f32)")
                raise KernelError
            if callee.name not in T.NUMERIC_TYPES:
                self.error(callee.span, "L0500", f"'{callee.name}' is a control type; kernels convert to numeric types")
                raise KernelError
            if len(e.args) != 1:
                self.error(e.span, "L0302", f"conversion {callee.name}(...) takes 1 argument, got {len(e.args)}")
                raise KernelError
            t = self.expr(e.args[0])
            if t == T.BOOL and callee.name != "bool":
                self.error(e.args[0].span, "L0300", f"cannot convert bool to {callee.name}; use select(c, 1, 0)")
                raise KernelError
            return T.Scalar(callee.name)
        if not isinstance(callee, ast.Name):
            self.error(callee.span, "L0303", "only intrinsics and conversions can be called in a kernel")
            raise KernelError
        name = callee.name
        if self.scopes.get(name) is None and self.core.lookup(self.info, name) is None:
            if name in KERNEL_MATH:
                return self.intrinsic(e, name)
            if name in CONTROL_HOST:
                self.error(callee.span, "L0500", f"'{name}' is control code; it cannot appear in a kernel",
                           notes=("validation and failures belong in `fn` policy, before launch",))
                raise KernelError
            self.error(callee.span, "L0200", f"unknown function '{name}'")
            raise KernelError
        sym = self.core.lookup(self.info, name)
        kind = sym.kind if sym else "local"
        self.error(callee.span, "L0500", f"a kernel cannot call {kind} '{name}'",
                   notes=("kernels call math intrinsics only; compose kernels in a command",))
        raise KernelError

    def intrinsic(self, e: ast.Call, name: str) -> T.CheckType:
        form, arity = KERNEL_MATH[name]
        if len(e.args) != arity:
            self.error(e.span, "L0302", f"{name} takes {arity} argument{'s' * (arity != 1)}, got {len(e.args)}")
            raise KernelError
        ts = [self.expr(a) for a in e.args]
        if form == "select":
            if ts[0] != T.BOOL:
                self.error(e.args[0].span, "L0308", f"select's condition must be bool, got {ts[0]}")
                raise KernelError
            ts, args = ts[1:], e.args[1:]
        else:
            args = e.args
        common = ts[0]
        for a, t in zip(args[1:], ts[1:]):
            if self.core.assignable(t, common):
                continue
            if self.core.assignable(common, t):
                common = t
                continue
            self.error(a.span, "L0301", f"{name} operands have different types {common} and {t}; no implicit casts")
            raise KernelError
        if form in ("float", "predicate") and common == T.UNTYPED_INT:
            common = T.UNTYPED_FLOAT  # `exp(1)`: an integer literal takes the float type it meets
        if form in ("float", "predicate") and not T.is_floating(common):
            self.error(args[0].span, "L0300", f"{name} takes a float, got {common}")
            raise KernelError
        if form in ("same", "select") and common == T.BOOL and form != "select":
            self.error(args[0].span, "L0300", f"{name} takes numbers, got bool")
            raise KernelError
        return T.BOOL if form == "predicate" else T.default_type(common)


def _describe(e: ast.Expr) -> str:
    return {
        "StrLit": "a string", "BytesLit": "bytes", "NullLit": "null", "ListLit": "a list literal",
        "MapLit": "a map literal", "TypeName": "a type name",
    }.get(type(e).__name__, "this expression")

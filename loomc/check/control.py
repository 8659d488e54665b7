"""Control code: `fn` policy and `check` blocks over dynamic values (run by the control VM).

Static types are tracked where they are known (literals, annotations, host
results) and `any` where they are not (map/list elements, decoded JSON). Known
types never convert implicitly: `"n=" + 3` is an error, `"n=" + str(3)` is not.
"""

from __future__ import annotations

from loomc.check import types as T
from loomc.check.core import ConstError, Core
from loomc.check.intrinsics import CONTROL_CONVERSIONS, CONTROL_HOST
from loomc.check.program import ModuleInfo
from loomc.check.scopes import Local, Scopes
from loomc.syntax import ast

ANY, NULL = T.ANY, T.NULL
INT, FLOAT, STR, BYTES, LIST, MAP, BOOL = (T.Dyn(n) for n in ("int", "float", "str", "bytes", "list", "map", "bool"))


class ControlError(Exception):
    """Already reported; stops cascading errors from one statement."""


def dyn_of(t: T.CheckType) -> T.Dyn:
    """Config types as control code sees them."""
    if isinstance(t, T.Dyn):
        return t
    if t == T.BOOL:
        return BOOL
    if isinstance(t, T.Scalar):
        return INT if t.is_int else FLOAT
    return ANY


def compatible(got: T.Dyn, want: T.Dyn) -> bool:
    """`any` meets everything; otherwise types must be equal (null is its own type)."""
    return want == ANY or got == ANY or got == want


class ControlChecker:
    def __init__(self, core: Core, info: ModuleInfo, item: ast.Fn | ast.Check):
        self.core = core
        self.info = info
        self.item = item
        self.scopes = Scopes()
        self.loop_depth = 0
        self.ret: T.Dyn | None = None

    def error(self, span: ast.Span, code: str, message: str, notes: tuple[str, ...] = ()) -> None:
        self.core.error(self.info, span, code, message, notes)

    def run(self) -> None:
        item = self.item
        if isinstance(item, ast.Fn):
            for arg in item.args:
                t = self.dyn_type(arg.type)
                if arg.mode is not None:
                    self.error(arg.span, "L0501", f"'{arg.mode}' applies to kernel and command tensors, not fn arguments")
                if self.scopes.declare(arg.name, Local(t or ANY, True, "arg")) is not None:
                    self.error(arg.span, "L0201", f"argument '{arg.name}' is already declared")
            self.ret = self.dyn_type(item.ret) if item.ret is not None else None
        self.block(item.body)
        host_fail = self.core.lookup(self.info, "fail") is None  # a module fn may hide the host's fail
        if isinstance(item, ast.Fn) and self.ret not in (None, NULL, ANY) and not _always_returns(item.body, host_fail):
            end = item.body.span
            self.error(ast.Span(end.end_line, max(end.end_column - 1, 1), end.end_line, end.end_column), "L0312",
                       f"fn '{item.name}' can reach its end without returning a {self.ret}")

    def dyn_type(self, t: ast.TypeRef | None) -> T.Dyn | None:
        if t is None:
            return None
        if isinstance(t, ast.DynTypeRef):
            return T.Dyn(t.name)
        if isinstance(t, ast.ScalarTypeRef) and t.name == "bool":
            return BOOL
        self.error(t.span, "L0501", "control code uses the types any, bool, int, float, str, bytes, list and map",
                   notes=("numeric storage types and tensors belong to kernels, commands and stages",))
        return ANY

    # ---- statements ---------------------------------------------------------------------

    def block(self, b: ast.Block) -> None:
        self.scopes.push()
        for s in b.stmts:
            try:
                getattr(self, "stmt_" + type(s).__name__.lower())(s)
            except ControlError:
                pass
        self.scopes.pop()

    def declare(self, name: str, span: ast.Span, local: Local) -> None:
        if self.scopes.declare(name, local) is not None:
            self.error(span, "L0205", f"'{name}' shadows an existing name")

    def initial(self, annotation: ast.TypeRef | None, value: ast.Expr | None, span: ast.Span) -> T.Dyn:
        want = self.dyn_type(annotation)
        if value is None:
            return want or ANY
        try:
            got = self.expr(value)
            if want is not None:
                self.expect(got, want, value.span)
        except ControlError:  # reported; still declare the name so later uses do not cascade
            return want or ANY
        if want is None and got == NULL:
            return ANY  # `var x = null` is a placeholder for a value assigned later
        return want or got

    def stmt_let(self, s: ast.Let) -> None:
        self.declare(s.name, s.name_span, Local(self.initial(s.type, s.value, s.span), False, "let"))

    def stmt_var(self, s: ast.Var) -> None:
        self.declare(s.name, s.name_span, Local(self.initial(s.type, s.value, s.span), True, "var"))

    def stmt_assign(self, s: ast.Assign) -> None:
        target = s.target
        if isinstance(target, ast.Name):
            local = self.scopes.get(target.name)
            if local is None:
                self.expr(target)
                raise ControlError
            if not local.mutable:
                self.error(target.span, "L0304", f"cannot assign to {local.kind} '{target.name}'",
                           notes=("declare it with `var` to make it assignable",))
                raise ControlError
            want = local.type
        elif isinstance(target, ast.Index):
            base = self.expr(target.base)
            if base not in (LIST, MAP, ANY):
                self.error(target.base.span, "L0309", f"cannot assign into {base}; only list and map elements are assignable")
                raise ControlError
            for i in target.indices:
                self.expr(i)
            want = ANY
        else:
            self.error(target.span, "L0309", "cannot assign to this expression")
            raise ControlError
        got = self.expr(s.value)
        if s.op != "=":
            got = self.arith(s.op[:-1], want, got, s.span, s.span)
        self.expect(got, want, s.value.span)

    def stmt_exprstmt(self, s: ast.ExprStmt) -> None:
        self.expr(s.expr)
        if not isinstance(s.expr, ast.Call):
            self.error(s.span, "L0310", "this expression's value is unused")

    def stmt_if(self, s: ast.If) -> None:
        self.condition(s.cond)
        self.block(s.then)
        if isinstance(s.orelse, ast.Block):
            self.block(s.orelse)
        elif isinstance(s.orelse, ast.If):
            self.stmt_if(s.orelse)

    def stmt_for(self, s: ast.For) -> None:
        if s.end is not None:
            for bound in (s.start, s.end):
                self.expect(self.expr(bound), INT, bound.span)
            var_t = INT
        else:
            it = self.expr(s.start)
            if it not in (LIST, MAP, STR, ANY, BYTES):
                self.error(s.start.span, "L0300", f"cannot iterate over {it}")
                raise ControlError
            var_t = {STR: STR, BYTES: INT, MAP: STR}.get(it, ANY)
        self.scopes.push()
        self.declare(s.var, s.var_span, Local(var_t, False, "loop"))
        self.loop_depth += 1
        self.block(s.body)
        self.loop_depth -= 1
        self.scopes.pop()

    def stmt_parallelfor(self, s: ast.ParallelFor) -> None:
        self.error(s.span, "L0501", "`parallel for` belongs in kernels; control code runs on the host VM")

    def stmt_while(self, s: ast.While) -> None:
        self.condition(s.cond)
        self.loop_depth += 1
        self.block(s.body)
        self.loop_depth -= 1

    def stmt_return(self, s: ast.Return) -> None:
        if isinstance(self.item, ast.Check):
            self.error(s.span, "L0501", "a check block does not return")
            return
        got = self.expr(s.value) if s.value is not None else NULL
        want = self.ret or NULL
        if not compatible(got, want) and not (want == NULL and s.value is None):
            self.error(s.value.span if s.value is not None else s.span, "L0311",
                       f"fn '{self.item.name}' returns {want}, got {got}")

    def stmt_break(self, s) -> None:
        if not self.loop_depth:
            self.error(s.span, "L0504", f"'{'break' if isinstance(s, ast.Break) else 'continue'}' outside a loop")

    stmt_continue = stmt_break

    def stmt_expect(self, s: ast.Expect) -> None:
        if not isinstance(self.item, ast.Check):
            self.error(s.span, "L0501", "`expect` belongs in check blocks")
            return
        self.condition(s.cond)

    def condition(self, e: ast.Expr) -> None:
        t = self.expr(e)
        if t not in (BOOL, ANY):
            self.error(e.span, "L0308", f"condition must be bool, got {t}")

    def expect(self, got: T.Dyn, want: T.Dyn, span: ast.Span) -> None:
        if not compatible(got, want):
            code = "L0301" if {got, want} == {INT, FLOAT} else "L0300"
            self.error(span, code, f"expected {want}, got {got}" + ("; no implicit casts" if code == "L0301" else ""))
            raise ControlError

    # ---- expressions -------------------------------------------------------------------

    def expr(self, e: ast.Expr) -> T.Dyn:
        return getattr(self, "expr_" + type(e).__name__.lower())(e)

    def expr_intlit(self, e) -> T.Dyn:
        return INT

    def expr_floatlit(self, e) -> T.Dyn:
        return FLOAT

    def expr_strlit(self, e) -> T.Dyn:
        return STR

    def expr_byteslit(self, e) -> T.Dyn:
        return BYTES

    def expr_boollit(self, e) -> T.Dyn:
        return BOOL

    def expr_nulllit(self, e) -> T.Dyn:
        return NULL

    def expr_paren(self, e: ast.Paren) -> T.Dyn:
        return self.expr(e.inner)

    def expr_listlit(self, e: ast.ListLit) -> T.Dyn:
        for item in e.items:
            self.expr(item)
        return LIST

    def expr_maplit(self, e: ast.MapLit) -> T.Dyn:
        for k, v in e.items:
            kt = self.expr(k)
            if kt not in (STR, ANY):
                self.error(k.span, "L0300", f"map keys are strings, got {kt}")
            self.expr(v)
        return MAP

    def expr_typename(self, e: ast.TypeName) -> T.Dyn:
        self.error(e.span, "L0300", f"type '{e.name}' used as a value; call it to convert, e.g. {e.name}(x)")
        raise ControlError

    def expr_bitcast(self, e: ast.Bitcast) -> T.Dyn:
        self.error(e.span, "L0501", "`bitcast` belongs in kernels")
        raise ControlError

    def expr_name(self, e: ast.Name) -> T.Dyn:
        local = self.scopes.get(e.name)
        if local is not None:
            return local.type
        sym = self.core.lookup(self.info, e.name)
        if sym is None:
            self.error(e.span, "L0200", f"unknown name '{e.name}'")
            raise ControlError
        if isinstance(sym.item, ast.Config):
            t = self.core.config_type(sym.module, sym.item)
            try:
                self.core.config_value(sym)
            except ConstError:
                raise ControlError
            return dyn_of(t) if t is not None else ANY
        self.error(e.span, "L0501", f"control code cannot use {sym.kind} '{e.name}' as a value")
        raise ControlError

    def expr_unary(self, e: ast.Unary) -> T.Dyn:
        t = self.expr(e.operand)
        ok = {"!": (BOOL, ANY), "-": (INT, FLOAT, ANY), "~": (INT, ANY)}[e.op]
        if t not in ok:
            self.error(e.span, "L0314", f"operator '{e.op}' is not defined for {t}")
            raise ControlError
        return t

    def expr_binary(self, e: ast.Binary) -> T.Dyn:
        lt, rt = self.expr(e.left), self.expr(e.right)
        op = e.op
        if op in ("&&", "||"):
            for side, t in ((e.left, lt), (e.right, rt)):
                if t not in (BOOL, ANY):
                    self.error(side.span, "L0300", f"'{op}' takes bool operands, got {t}")
                    raise ControlError
            return BOOL
        if op in ("==", "!="):
            known = {lt, rt} - {ANY, NULL}
            if len(known) == 2 and known != {INT, FLOAT}:
                self.error(e.op_span, "L0300", f"comparing {lt} with {rt} is always {'false' if op == '==' else 'true'}")
            elif known == {INT, FLOAT}:
                self.error(e.op_span, "L0301", f"comparing int with float; no implicit casts")
            return BOOL
        if op in ("<", "<=", ">", ">="):
            self.same(e, lt, rt, (INT, FLOAT, STR))
            return BOOL
        return self.arith(op, lt, rt, e.op_span, e.span)

    def same(self, e: ast.Binary, lt: T.Dyn, rt: T.Dyn, allowed: tuple[T.Dyn, ...]) -> T.Dyn:
        if lt == ANY or rt == ANY:
            return rt if lt == ANY else lt
        if lt != rt:
            code = "L0301" if {lt, rt} == {INT, FLOAT} else "L0300"
            self.error(e.op_span, code, f"operands of '{e.op}' have different types {lt} and {rt}"
                       + ("; no implicit casts" if code == "L0301" else ""))
            raise ControlError
        if lt not in allowed:
            self.error(e.op_span, "L0314", f"operator '{e.op}' is not defined for {lt}")
            raise ControlError
        return lt

    def arith(self, op: str, lt: T.Dyn, rt: T.Dyn, op_span: ast.Span, span: ast.Span) -> T.Dyn:
        allowed = {
            "+": (INT, FLOAT, STR, LIST, BYTES), "-": (INT, FLOAT), "*": (INT, FLOAT), "/": (INT, FLOAT),
            "%": (INT, FLOAT), "&": (INT,), "|": (INT,), "^": (INT,), "<<": (INT,), ">>": (INT,),
        }[op]
        return self.same(ast.Binary(op, ast.NullLit(), ast.NullLit(), span, op_span), lt, rt, allowed)

    def expr_index(self, e: ast.Index) -> T.Dyn:
        base = self.expr(e.base)
        if len(e.indices) != 1:
            self.error(e.span, "L0306", "control values take exactly one index")
            raise ControlError
        it = self.expr(e.indices[0])
        if base in (LIST, STR, BYTES):
            self.expect(it, INT, e.indices[0].span)
            return {STR: STR, BYTES: INT}.get(base, ANY)
        if base == MAP:
            self.expect(it, STR, e.indices[0].span)
            return ANY
        if base == ANY:
            return ANY
        self.error(e.base.span, "L0300", f"{base} cannot be indexed")
        raise ControlError

    def expr_call(self, e: ast.Call) -> T.Dyn:
        callee = e.callee
        args = [self.expr(a) for a in e.args]
        if isinstance(callee, ast.TypeName):
            if callee.name not in CONTROL_CONVERSIONS:
                kind = "a control type without a conversion" if callee.name in T.DYN_TYPES else "a kernel type"
                self.error(callee.span, "L0501", f"'{callee.name}' is {kind}; control code converts with "
                                                 "int(), float(), str() and bool() (and encode_utf8 for bytes)")
                raise ControlError
            if len(args) != 1:
                self.error(e.span, "L0302", f"{callee.name}() takes 1 argument, got {len(args)}")
                raise ControlError
            return T.Dyn(callee.name)
        if not isinstance(callee, ast.Name):
            self.error(callee.span, "L0303", "only named functions can be called")
            raise ControlError
        if self.scopes.get(callee.name) is not None:
            self.error(callee.span, "L0303", f"'{callee.name}' is a value, not a function")
            raise ControlError
        sym = self.core.lookup(self.info, callee.name)
        if sym is not None:
            if not isinstance(sym.item, ast.Fn):
                self.error(callee.span, "L0501", f"control code cannot call {sym.kind} '{callee.name}'",
                           notes=("kernels and commands run through stages that the host binds",))
                raise ControlError
            params = [self.dyn_type_quiet(a.type) for a in sym.item.args]
            result = self.dyn_type_quiet(sym.item.ret) if sym.item.ret is not None else NULL
            return self.apply(e, callee.name, params, args, result, variadic=False)
        host = CONTROL_HOST.get(callee.name)
        if host is None:
            self.error(callee.span, "L0200", f"unknown function '{callee.name}'")
            raise ControlError
        params, result = host
        return self.apply(e, callee.name, [T.Dyn(p) for p in params], args, T.Dyn(result), variadic=False)

    @staticmethod
    def dyn_type_quiet(t: ast.TypeRef) -> T.Dyn:
        if isinstance(t, ast.DynTypeRef):
            return T.Dyn(t.name)
        return BOOL if isinstance(t, ast.ScalarTypeRef) and t.name == "bool" else ANY

    def apply(self, e: ast.Call, name: str, params: list[T.Dyn], args: list[T.Dyn], result: T.Dyn,
              variadic: bool) -> T.Dyn:
        if len(args) != len(params):
            self.error(e.span, "L0302", f"'{name}' takes {len(params)} argument{'s' * (len(params) != 1)}, "
                                        f"got {len(args)}")
            raise ControlError
        for a, got, want in zip(e.args, args, params):
            self.expect(got, want, a.span)
        return result


def _always_returns(b: ast.Block, host_fail: bool = True) -> bool:
    for s in b.stmts:
        if isinstance(s, ast.Return):
            return True
        if host_fail and isinstance(s, ast.ExprStmt) and isinstance(s.expr, ast.Call) \
                and isinstance(s.expr.callee, ast.Name) and s.expr.callee.name == "fail":
            return True
        if isinstance(s, ast.If) and s.orelse is not None and _always_returns(s.then, host_fail):
            other = s.orelse if isinstance(s.orelse, ast.Block) else ast.Block([s.orelse])
            if _always_returns(other, host_fail):
                return True
        if isinstance(s, ast.While) and isinstance(s.cond, ast.BoolLit) and s.cond.value and not _has_break(s.body):
            return True
    return False


def _has_break(b: ast.Block) -> bool:
    for s in b.stmts:
        if isinstance(s, ast.Break):
            return True
        if isinstance(s, ast.If):
            if _has_break(s.then) or (s.orelse is not None and _has_break(
                    s.orelse if isinstance(s.orelse, ast.Block) else ast.Block([s.orelse]))):
                return True
    return False

"""Control code → stack bytecode: the `fn`s and `check`s of a checked program as a `VmProgram`.

`compile_program` runs after the checker has accepted the program, so it trusts names,
arities and static types and only lays out code; everything that depends on values
(types behind `any`, indexes, sizes) is checked by the interpreter, `loomc.run.vm`.

A function is a list of instructions `(op, a, b)` over one operand stack and numbered
slots (arguments first, then one slot per declaration, then two hidden slots per loop),
a constant pool (null, bool, int, float, str, bytes: never a mutable value, so list and
map literals are built by `BUILD_LIST`/`BUILD_MAP` each time they run), and a line and a
column per instruction, which every run-time error reports. Jump targets are absolute
instruction indexes. The data is plain so that `.loombc` can carry it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from loomc.check import CheckedProgram
from loomc.check.intrinsics import CONTROL_CONVERSIONS, CONTROL_HOST
from loomc.check.program import ModuleInfo
from loomc.syntax import ast
from loomc.syntax.diagnostics import Diagnostic


class Op(IntEnum):
    """The closed instruction set. Comments give the stack effect, top of stack on the right.

    Ordered by how often typical policy code runs them: the interpreter tests the hot
    ones first."""

    LOAD = 0           # -- slots[a]
    CONST = 1          # -- consts[a]
    STORE = 2          # v --            slots[a] = v
    JUMP_IF_FALSE = 3  # c --            jump to a when c is false (c must be a bool)
    LOOP = 4           # --              jump back to a; the instruction budget is checked here
    ITER_NEXT = 5      # -- x            next element of the loop in slots a, a+1, or jump to b when done
    RANGE_NEXT = 6     # -- i            next integer of the range in slots a, a+1, or jump to b when done
    INDEX = 7          # x i -- x[i]
    ADD = 8            # x y -- x + y     (int, float, str, bytes, list)
    EQ = 9             # x y -- x == y    (any two values; different types are never equal)
    LT = 10            # x y -- x < y     (int, float, str; both the same type)
    CALL_HOST = 11     # args -- r        host function a of VmProgram.host_names with b arguments
    CALL = 12          # args -- r        function a of VmProgram.functions with b arguments
    RETURN = 13        # v --             return v to the caller
    POP = 14           # v --
    JUMP = 15          # --               jump forward to a
    SUB = 16
    MUL = 17
    DIV = 18           # integer division truncates toward zero, as constant folding does
    MOD = 19           # integer remainder has the sign of the dividend
    NE = 20
    LE = 21
    GT = 22
    GE = 23
    BAND = 24
    BOR = 25
    BXOR = 26
    SHL = 27
    SHR = 28
    NEG = 29           # x -- -x
    NOT = 30           # b -- !b
    INV = 31           # x -- ~x
    AND_JUMP = 32      # c -- c | --      `&&`: if c is false jump to a keeping it, else pop it
    OR_JUMP = 33       # c -- c | --      `||`: if c is true jump to a keeping it, else pop it
    CHECK_BOOL = 34    # c -- c           the right operand of && and || must be a bool
    BUILD_LIST = 35    # x1..xa -- [x1..xa]
    BUILD_MAP = 36     # k1 v1..ka va -- {k1: v1, ...}
    SET_INDEX = 37     # x i v --         x[i] = v
    DUP2 = 38          # x i -- x i x i   (compound assignment to an element)
    ITER_INIT = 39     # x --             slots[a] = snapshot of x to iterate, slots[a+1] = 0
    RANGE_INIT = 40    # lo hi --         slots[a] = lo, slots[a+1] = hi
    EXPECT = 41        # c --             check blocks: fail expectation a unless c is true
    EXPECT_CMP = 42    # x y --           check blocks: fail expectation a unless `x <op b> y`; reports x and y


BINARY_OPS = {
    "+": Op.ADD, "-": Op.SUB, "*": Op.MUL, "/": Op.DIV, "%": Op.MOD,
    "&": Op.BAND, "|": Op.BOR, "^": Op.BXOR, "<<": Op.SHL, ">>": Op.SHR,
    "==": Op.EQ, "!=": Op.NE, "<": Op.LT, "<=": Op.LE, ">": Op.GT, ">=": Op.GE,
}
COMPARISONS = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)
UNARY_OPS = {"-": Op.NEG, "!": Op.NOT, "~": Op.INV}
# Host functions that always give a bool, so `a && has(m, "k")` needs no CHECK_BOOL.
_BOOL_HOSTS = frozenset(name for name, (_, result) in CONTROL_HOST.items() if result == "bool")
# What `var x: T` without a value holds: the zero of T (a fresh list or map each time).
_ZERO = {"int": 0, "float": 0.0, "str": "", "bytes": b"", "bool": False}


class VmCompileError(Exception):
    """The program did not check clean; control code is compiled only from a clean program."""

    def __init__(self, diagnostics: list[Diagnostic]):
        first = diagnostics[0].header() if diagnostics else "the program was not checked"
        super().__init__(f"cannot compile control code: {first}")
        self.diagnostics = diagnostics


@dataclass(frozen=True)
class Expectation:
    """One `expect` of a check block: where it is and the source text of its condition."""

    line: int
    column: int
    text: str


@dataclass
class VmFunction:
    name: str
    kind: str  # "fn" | "check"
    path: str  # display path of the module, as diagnostics print it
    line: int
    column: int
    arg_names: tuple[str, ...]
    arg_types: tuple[str, ...]  # control type names; "any" accepts everything
    ret_type: str  # "any", a control type name, or "null" for a fn without `->`
    num_slots: int = 0
    code: list[tuple[int, Any, Any]] = field(default_factory=list)
    consts: list[Any] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    columns: list[int] = field(default_factory=list)
    expects: list[Expectation] = field(default_factory=list)

    @property
    def qualname(self) -> str:
        return f"{self.path}::{self.name}"


@dataclass
class VmProgram:
    """Compiled control code. `entry` maps a plain fn name to its index in `functions`:
    the control program's fns for a model document, otherwise every fn whose name is
    unique (an ambiguous name maps to None; call it by `qualname`)."""

    functions: list[VmFunction]
    checks: list[VmFunction]
    host_names: tuple[str, ...]
    entry: dict[str, int | None]

    def function(self, name: str) -> VmFunction:
        if name in self.entry:
            index = self.entry[name]
            if index is None:
                options = ", ".join(f.qualname for f in self.functions if f.name == name)
                raise KeyError(f"fn '{name}' is defined in several modules; call one of: {options}")
            return self.functions[index]
        for f in self.functions:
            if f.qualname == name:
                return f
        raise KeyError(f"no fn named '{name}' in this program")

    def instruction_count(self) -> int:
        return sum(len(f.code) for f in self.functions + self.checks)


def compile_program(checked: CheckedProgram) -> VmProgram:
    """Compile every `fn` and `check` of a checked program. Raises VmCompileError unless `checked.ok`."""
    if not checked.ok:
        raise VmCompileError(checked.diagnostics)
    return _ProgramCompiler(checked).run()


class _ProgramCompiler:
    def __init__(self, checked: CheckedProgram):
        self.checked = checked
        self.core = checked.core
        self.functions: list[VmFunction] = []
        self.fn_index: dict[tuple[str, str], int] = {}
        self.host_names: list[str] = []
        self.host_index: dict[str, int] = {}

    def run(self) -> VmProgram:
        pending: list[tuple[ModuleInfo, ast.Fn | ast.Check, VmFunction]] = []
        checks: list[VmFunction] = []
        for info in self.checked.modules:
            for item in info.module.items:
                if isinstance(item, ast.Fn):
                    fn = _signature(info, item)
                    self.fn_index[(info.key, item.name)] = len(self.functions)
                    self.functions.append(fn)
                    pending.append((info, item, fn))
                elif isinstance(item, ast.Check):
                    fn = VmFunction(item.name, "check", info.path, item.name_span.line, item.name_span.column,
                                    (), (), "null")
                    checks.append(fn)
                    pending.append((info, item, fn))
        for info, item, fn in pending:
            _FnCompiler(self, info, item, fn).run()
        return VmProgram(self.functions, checks, tuple(self.host_names), self._entry())

    def _entry(self) -> dict[str, int | None]:
        control = {info.key for info in self.checked.roles.get("control", [])}
        entry: dict[str, int | None] = {}
        for (key, name), index in self.fn_index.items():
            if control and key not in control:
                continue
            entry[name] = None if name in entry else index
        return entry

    def host(self, name: str) -> int:
        if name not in self.host_index:
            self.host_index[name] = len(self.host_names)
            self.host_names.append(name)
        return self.host_index[name]


def _type_name(t: ast.TypeRef | None) -> str:
    if isinstance(t, ast.DynTypeRef):
        return t.name
    if isinstance(t, ast.ScalarTypeRef) and t.name == "bool":
        return "bool"
    return "any"


def _signature(info: ModuleInfo, item: ast.Fn) -> VmFunction:
    return VmFunction(item.name, "fn", info.path, item.name_span.line, item.name_span.column,
                      tuple(a.name for a in item.args), tuple(_type_name(a.type) for a in item.args),
                      _type_name(item.ret) if item.ret is not None else "null")


class _Loop:
    def __init__(self, continue_at: int):
        self.continue_at = continue_at
        self.breaks: list[int] = []


class _FnCompiler:
    def __init__(self, program: _ProgramCompiler, info: ModuleInfo, item: ast.Fn | ast.Check, fn: VmFunction):
        self.program = program
        self.core = program.core
        self.info = info
        self.item = item
        self.fn = fn
        self.scopes: list[dict[str, int]] = [{}]
        self.loops: list[_Loop] = []
        self.source = program.checked.sources.get(info.path, "").split("\n")
        self.const_index: dict[tuple[type, Any], int] = {}

    # ---- emission ---------------------------------------------------------------------

    def emit(self, op: Op, span: ast.Span, a: Any = 0, b: Any = 0) -> int:
        fn = self.fn
        fn.code.append((int(op), a, b))
        fn.lines.append(span.line)
        fn.columns.append(span.column)
        return len(fn.code) - 1

    def here(self) -> int:
        return len(self.fn.code)

    def patch(self, at: int, target: int, slot: str = "a") -> None:
        op, a, b = self.fn.code[at]
        self.fn.code[at] = (op, target, b) if slot == "a" else (op, a, target)

    def const(self, value: Any, span: ast.Span) -> None:
        # 1, 1.0 and True stay distinct constants, and so do 0.0 and -0.0
        key = (type(value), repr(value) if type(value) is float else value)
        if key not in self.const_index:
            self.const_index[key] = len(self.fn.consts)
            self.fn.consts.append(value)
        self.emit(Op.CONST, span, self.const_index[key])

    def new_slot(self, count: int = 1) -> int:
        slot = self.fn.num_slots
        self.fn.num_slots += count
        return slot

    def declare(self, name: str) -> int:
        slot = self.new_slot()
        self.scopes[-1][name] = slot
        return slot

    def local(self, name: str) -> int | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    # ---- functions and statements -----------------------------------------------------

    def run(self) -> None:
        item = self.item
        if isinstance(item, ast.Fn):
            for arg in item.args:
                self.declare(arg.name)
        self.block(item.body, push=False)
        close = item.body.span
        end = ast.Span(close.end_line, max(close.end_column - 1, 1), close.end_line, close.end_column)  # the `}`
        self.const(None, end)  # falling off the end returns null (the VM checks it against `->`)
        self.emit(Op.RETURN, end)

    def block(self, b: ast.Block, push: bool = True) -> None:
        if push:
            self.scopes.append({})
        for s in b.stmts:
            getattr(self, "stmt_" + type(s).__name__.lower())(s)
        if push:
            self.scopes.pop()

    def stmt_let(self, s: ast.Let | ast.Var) -> None:
        if s.value is not None:
            self.expr(s.value)
        else:
            self.zero(_type_name(s.type) if s.type is not None else "any", s.span)
        self.emit(Op.STORE, s.name_span, self.declare(s.name))

    stmt_var = stmt_let

    def zero(self, type_name: str, span: ast.Span) -> None:
        if type_name == "list":
            self.emit(Op.BUILD_LIST, span, 0)
        elif type_name == "map":
            self.emit(Op.BUILD_MAP, span, 0)
        else:
            self.const(_ZERO.get(type_name), span)

    def stmt_assign(self, s: ast.Assign) -> None:
        target = s.target
        op = BINARY_OPS[s.op[:-1]] if s.op != "=" else None
        if isinstance(target, ast.Name):
            slot = self.local(target.name)
            if op is not None:
                self.emit(Op.LOAD, target.span, slot)
                self.expr(s.value)
                self.emit(op, s.span)
            else:
                self.expr(s.value)
            self.emit(Op.STORE, target.span, slot)
            return
        assert isinstance(target, ast.Index)  # the checker allows only names and one-index elements
        self.expr(target.base)
        self.expr(target.indices[0])
        if op is not None:
            self.emit(Op.DUP2, target.span)
            self.emit(Op.INDEX, target.indices[0].span)
            self.expr(s.value)
            self.emit(op, s.span)
        else:
            self.expr(s.value)
        self.emit(Op.SET_INDEX, target.span)

    def stmt_exprstmt(self, s: ast.ExprStmt) -> None:
        self.expr(s.expr)
        self.emit(Op.POP, s.span)

    def stmt_if(self, s: ast.If) -> None:
        self.expr(s.cond)
        skip = self.emit(Op.JUMP_IF_FALSE, s.cond.span)
        self.block(s.then)
        if s.orelse is None:
            self.patch(skip, self.here())
            return
        done = self.emit(Op.JUMP, s.span)
        self.patch(skip, self.here())
        if isinstance(s.orelse, ast.If):
            self.stmt_if(s.orelse)
        else:
            self.block(s.orelse)
        self.patch(done, self.here())

    def stmt_while(self, s: ast.While) -> None:
        top = self.here()
        exit_jump = None
        if not (isinstance(s.cond, ast.BoolLit) and s.cond.value):
            self.expr(s.cond)
            exit_jump = self.emit(Op.JUMP_IF_FALSE, s.cond.span)
        self.loop_body(_Loop(top), s.body, s.span)
        if exit_jump is not None:
            self.patch(exit_jump, self.here())

    def stmt_for(self, s: ast.For) -> None:
        state = self.new_slot(2)
        if s.end is None:
            self.expr(s.start)
            self.emit(Op.ITER_INIT, s.start.span, state)
            step = Op.ITER_NEXT
        else:
            self.expr(s.start)
            self.expr(s.end)
            self.emit(Op.RANGE_INIT, s.start.span, state)
            step = Op.RANGE_NEXT
        top = self.emit(step, s.var_span, state)
        self.scopes.append({})
        self.emit(Op.STORE, s.var_span, self.declare(s.var))
        self.loop_body(_Loop(top), s.body, s.span)
        self.scopes.pop()
        self.patch(top, self.here(), slot="b")

    def loop_body(self, loop: _Loop, body: ast.Block, span: ast.Span) -> None:
        self.loops.append(loop)
        self.block(body)
        self.emit(Op.LOOP, span, loop.continue_at)
        self.loops.pop()
        for at in loop.breaks:
            self.patch(at, self.here())

    def stmt_break(self, s: ast.Break) -> None:
        self.loops[-1].breaks.append(self.emit(Op.JUMP, s.span))

    def stmt_continue(self, s: ast.Continue) -> None:
        self.emit(Op.LOOP, s.span, self.loops[-1].continue_at)

    def stmt_return(self, s: ast.Return) -> None:
        if s.value is not None:
            self.expr(s.value)
        else:
            self.const(None, s.span)
        self.emit(Op.RETURN, s.span)

    def stmt_expect(self, s: ast.Expect) -> None:
        index = len(self.fn.expects)
        self.fn.expects.append(Expectation(s.span.line, s.span.column, self.text(s.cond.span)))
        cond = s.cond
        while isinstance(cond, ast.Paren):
            cond = cond.inner
        if isinstance(cond, ast.Binary) and BINARY_OPS.get(cond.op) in COMPARISONS:
            self.expr(cond.left)
            self.expr(cond.right)
            self.emit(Op.EXPECT_CMP, s.span, index, int(BINARY_OPS[cond.op]))
        else:
            self.expr(s.cond)
            self.emit(Op.EXPECT, s.span, index)  # a failed expect points at its `expect`

    def text(self, span: ast.Span) -> str:
        lines = self.source[span.line - 1: span.end_line]
        if not lines:
            return ""
        if len(lines) == 1:
            return lines[0][span.column - 1: span.end_column - 1]
        lines[-1] = lines[-1][: span.end_column - 1]
        lines[0] = lines[0][span.column - 1:]
        return " ".join(line.strip() for line in lines)

    # ---- expressions ------------------------------------------------------------------

    def expr(self, e: ast.Expr) -> None:
        getattr(self, "expr_" + type(e).__name__.lower())(e)

    def expr_intlit(self, e) -> None:
        self.const(e.value, e.span)

    expr_floatlit = expr_strlit = expr_byteslit = expr_boollit = expr_intlit

    def expr_nulllit(self, e: ast.NullLit) -> None:
        self.const(None, e.span)

    def expr_paren(self, e: ast.Paren) -> None:
        self.expr(e.inner)

    def expr_name(self, e: ast.Name) -> None:
        slot = self.local(e.name)
        if slot is not None:
            self.emit(Op.LOAD, e.span, slot)
            return
        sym = self.core.lookup(self.info, e.name)
        assert sym is not None and isinstance(sym.item, ast.Config), e.name  # the checker allows only configs
        self.const(self.core.config_value(sym), e.span)

    def expr_listlit(self, e: ast.ListLit) -> None:
        for item in e.items:
            self.expr(item)
        self.emit(Op.BUILD_LIST, e.span, len(e.items))

    def expr_maplit(self, e: ast.MapLit) -> None:
        for k, v in e.items:
            self.expr(k)
            self.expr(v)
        self.emit(Op.BUILD_MAP, e.span, len(e.items))

    def expr_unary(self, e: ast.Unary) -> None:
        self.expr(e.operand)
        self.emit(UNARY_OPS[e.op], e.span)

    def expr_binary(self, e: ast.Binary) -> None:
        self.expr(e.left)
        if e.op in ("&&", "||"):
            jump = self.emit(Op.AND_JUMP if e.op == "&&" else Op.OR_JUMP, e.op_span)
            self.expr(e.right)
            if not self.is_bool(e.right):
                self.emit(Op.CHECK_BOOL, e.right.span)
            self.patch(jump, self.here())
            return
        self.expr(e.right)
        self.emit(BINARY_OPS[e.op], e.op_span)

    def is_bool(self, e: ast.Expr) -> bool:
        """Whether `e` yields a bool whatever its operands hold (so CHECK_BOOL can be skipped)."""
        while isinstance(e, ast.Paren):
            e = e.inner
        if isinstance(e, ast.BoolLit):
            return True
        if isinstance(e, ast.Binary):
            return e.op in ("&&", "||") or BINARY_OPS.get(e.op) in COMPARISONS
        if isinstance(e, ast.Unary):
            return e.op == "!"
        if isinstance(e, ast.Call) and isinstance(e.callee, ast.Name):
            return e.callee.name in _BOOL_HOSTS and self.core.lookup(self.info, e.callee.name) is None
        return False

    def expr_index(self, e: ast.Index) -> None:
        self.expr(e.base)
        self.expr(e.indices[0])
        self.emit(Op.INDEX, e.indices[0].span)

    def expr_call(self, e: ast.Call) -> None:
        for a in e.args:
            self.expr(a)
        callee = e.callee
        if isinstance(callee, ast.TypeName):
            assert callee.name in CONTROL_CONVERSIONS
            self.emit(Op.CALL_HOST, e.span, self.program.host(callee.name), len(e.args))
            return
        assert isinstance(callee, ast.Name)
        sym = self.core.lookup(self.info, callee.name)
        if sym is not None:
            index = self.program.fn_index[(sym.module.key, sym.item.name)]
            self.emit(Op.CALL, e.span, index, len(e.args))
            return
        assert callee.name in CONTROL_HOST
        self.emit(Op.CALL_HOST, e.span, self.program.host(callee.name), len(e.args))


def disassemble(fn: VmFunction) -> str:
    """Human-readable listing, one instruction a line: index, line:col, opcode, operands."""
    out = [f"{fn.kind} {fn.qualname} ({fn.num_slots} slots)"]
    for i, (op, a, b) in enumerate(fn.code):
        name = Op(op).name
        operand = ""
        if op == Op.CONST:
            operand = repr(fn.consts[a])
        elif op in (Op.LOAD, Op.STORE, Op.JUMP, Op.JUMP_IF_FALSE, Op.LOOP, Op.AND_JUMP, Op.OR_JUMP, Op.BUILD_LIST,
                    Op.BUILD_MAP, Op.ITER_INIT, Op.RANGE_INIT, Op.EXPECT):
            operand = str(a)
        elif op in (Op.ITER_NEXT, Op.RANGE_NEXT, Op.CALL, Op.CALL_HOST):
            operand = f"{a} {b}"
        elif op == Op.EXPECT_CMP:
            operand = f"{a} {Op(b).name}"
        out.append(f"{i:5} {fn.lines[i]:4}:{fn.columns[i]:<3} {name:<14}{operand}".rstrip())
    return "\n".join(out)


__all__ = ["BINARY_OPS", "Expectation", "Op", "VmCompileError", "VmFunction", "VmProgram", "compile_program",
           "disassemble"]

"""The control VM: runs the `fn` policy and `check` blocks that `loomc.lower.vm` compiled.

Services call it as `Vm(program, host).call("render", [request])`. Values are the
JSON-like Python values the host already has (None, bool, int, float, str, bytes,
list, dict) plus opaque host handles (a tokenizer); lists and maps are shared by
reference, so the host sees what `append` did to a list it passed in.

One loop runs every call of one `Vm.call`, with an explicit frame stack (a recursive
policy does not recurse in Python). Every instruction counts against the call's
budget, checked at loop back-edges and calls; values are bounded in size by the host
context. Every error the VM raises is a `VmError` whose message starts with the
`path:line:col` of the instruction that failed; `fail(...)` raises `PolicyFailure`.
See docs/language.md §18 for the semantics.
"""

from __future__ import annotations

import math

from typing import Any

from loomc.lower.vm import Op, VmFunction, VmProgram
from loomc.run.errors import PolicyFailure, VmBudgetExceeded, VmError, VmExpectFailed, VmMemoryExceeded, VmRuntimeError
from loomc.run.host import (INT_BITS, INT_LIMIT, PY_TYPES, TYPE_NAMES, HostContext, HostFunctions, show, too_large,
                            type_name, values_equal)

_OPS = tuple(int(op) for op in Op)
assert _OPS == tuple(range(len(_OPS))), "opcodes are dense, in declaration order"

_ORDERING = frozenset(int(op) for op in (Op.LT, Op.LE, Op.GT, Op.GE))
_SYMBOL = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.DIV: "/", Op.MOD: "%", Op.BAND: "&", Op.BOR: "|",
           Op.BXOR: "^", Op.SHL: "<<", Op.SHR: ">>", Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=",
           Op.GT: ">", Op.GE: ">="}


class _Fn:
    """A function as the loop wants it: code, constants and precomputed type checks."""

    __slots__ = ("fn", "code", "consts", "num_slots", "arg_types", "ret_type", "name")

    def __init__(self, fn: VmFunction):
        self.fn = fn
        self.code = fn.code
        self.consts = fn.consts
        self.num_slots = fn.num_slots
        self.arg_types = tuple(PY_TYPES[t] for t in fn.arg_types)
        self.ret_type = PY_TYPES[fn.ret_type]
        self.name = fn.name


class Vm:
    def __init__(self, program: VmProgram, host: HostContext | None = None):
        self.program = program
        self.host = host or HostContext()
        self._host = HostFunctions(self.host)
        self._host_table = self._host.table(program.host_names)
        self._fns = [_Fn(f) for f in program.functions]
        self._by_id = {id(r.fn): r for r in self._fns}
        self._checks = {id(c): _Fn(c) for c in program.checks}

    def has(self, fn_name: str) -> bool:
        try:
            self.program.function(fn_name)
        except KeyError:
            return False
        return True

    def call(self, fn_name: str, args: list, budget: int | None = None) -> Any:
        """Run fn `fn_name` (a plain name or `path::name`) with `args`; return its result.

        `budget` is the number of instructions this call may run (default: the host
        context's). Raises PolicyFailure when the policy calls fail(), VmError otherwise."""
        return self.call_counted(fn_name, args, budget)[0]

    def call_counted(self, fn_name: str, args: list, budget: int | None = None) -> tuple[Any, int]:
        """`call`, also returning the instructions it ran (allocation fuel included), for metrics."""
        try:
            fn = self.program.function(fn_name)
        except KeyError as exc:
            raise VmRuntimeError(str(exc.args[0])) from None
        rec = self._by_id[id(fn)]
        if len(args) != len(rec.arg_types):
            raise VmRuntimeError(f"{fn.path}:{fn.line}:{fn.column}: fn '{fn.name}' takes {len(rec.arg_types)} "
                                 f"argument{'s' * (len(rec.arg_types) != 1)}, got {len(args)}")
        for name, declared, want, got in zip(fn.arg_names, fn.arg_types, rec.arg_types, args):
            if want is not None and type(got) is not want:
                raise VmRuntimeError(f"{fn.path}:{fn.line}:{fn.column}: fn '{fn.name}' argument '{name}' must be "
                                     f"{declared}, got {type_name(got)}")
        return self._run(rec, list(args), self._budget(budget))

    def run_check(self, check: VmFunction, budget: int | None = None) -> None:
        """Run one check block of the program. Raises VmExpectFailed at the first false `expect`."""
        self._run(self._checks[id(check)], [], self._budget(budget))

    def _budget(self, budget: int | None) -> int:
        return self.host.instruction_budget if budget is None else budget

    # ---- the loop -----------------------------------------------------------------------

    def _run(self, rec: _Fn, slots: list, limit: int) -> tuple[Any, int]:  # noqa: C901 - one loop, by design
        # Opcodes as locals, in Op's order (a test holds this line to it): cheaper to compare than globals.
        (LOAD, CONST, STORE, JUMP_IF_FALSE, LOOP, ITER_NEXT, RANGE_NEXT, INDEX, ADD, EQ, LT, CALL_HOST, CALL, RETURN,
         POP, JUMP, SUB, MUL, DIV, MOD, NE, LE, GT, GE, BAND, BOR, BXOR, SHL, SHR, NEG, NOT, INV, AND_JUMP, OR_JUMP,
         CHECK_BOOL, BUILD_LIST, BUILD_MAP, SET_INDEX, DUP2, ITER_INIT, RANGE_INIT, EXPECT, EXPECT_CMP) = _OPS
        fns = self._fns
        host_table = self._host_table
        max_depth = self.host.max_call_depth
        max_chars = self.host.max_chars
        max_items = self.host.max_items
        shift = self.host.alloc_fuel_shift
        binary = self._binary
        code = rec.code
        consts = rec.consts
        slots.extend([None] * (rec.num_slots - len(slots)))
        stack: list = []
        push = stack.append
        pop = stack.pop
        frames: list[tuple] = []
        pc = 0
        n = 0
        try:
            while True:
                op, a, b = code[pc]
                pc += 1
                n += 1
                if op <= INDEX:  # the hottest eight
                    if op == LOAD:
                        push(slots[a])
                    elif op == CONST:
                        push(consts[a])
                    elif op == STORE:
                        slots[a] = pop()
                    elif op == JUMP_IF_FALSE:
                        c = pop()
                        if c is False:
                            pc = a
                        elif c is not True:
                            raise VmRuntimeError(f"a condition must be a bool, got {type_name(c)}")
                    elif op == LOOP:
                        if n > limit:
                            raise VmBudgetExceeded(f"instruction budget of {limit} used up (a loop that never ends?)")
                        pc = a
                    elif op == ITER_NEXT:
                        seq = slots[a]
                        i = slots[a + 1]
                        if i < len(seq):
                            push(seq[i])
                            slots[a + 1] = i + 1
                        else:
                            pc = b
                    elif op == RANGE_NEXT:
                        i = slots[a]
                        if i < slots[a + 1]:
                            push(i)
                            slots[a] = i + 1
                        else:
                            pc = b
                    else:  # INDEX
                        i = pop()
                        x = stack[-1]
                        if type(x) is list and type(i) is int and 0 <= i < len(x):
                            stack[-1] = x[i]
                        elif type(x) is dict and type(i) is str and i in x:
                            stack[-1] = x[i]
                        else:
                            stack[-1] = _index(x, i)
                elif op <= JUMP:
                    if op == ADD:
                        y = pop()
                        x = stack[-1]
                        tx = type(x)
                        if tx is int and type(y) is int:
                            r = x + y
                            if not -INT_LIMIT < r < INT_LIMIT:
                                raise _int_overflow(r)
                            stack[-1] = r
                        elif tx is str and type(y) is str:
                            size = len(x) + len(y)
                            if size > max_chars:
                                raise too_large("a str", size, max_chars, "characters")
                            n += size >> shift
                            stack[-1] = x + y
                        else:
                            r = binary(ADD, x, y)
                            tr = type(r)
                            if tr is not float:
                                n += (len(r) << 3 if tr is list else len(r)) >> shift
                            stack[-1] = r
                    elif op == EQ:
                        y = pop()
                        x = stack[-1]
                        tx = type(x)
                        if tx is type(y) and tx is not list and tx is not dict:
                            stack[-1] = x == y
                        else:
                            stack[-1] = values_equal(x, y)
                    elif op == LT:
                        y = pop()
                        x = stack[-1]
                        tx = type(x)
                        if tx is type(y) and (tx is int or tx is float or tx is str):
                            stack[-1] = x < y
                        else:
                            stack[-1] = binary(LT, x, y)
                    elif op == CALL_HOST:
                        impl, params = host_table[a]
                        args = stack[len(stack) - b:]
                        del stack[len(stack) - b:]
                        for v, t in zip(args, params):
                            if t is not None and type(v) is not t:
                                raise _host_arg_error(self.program.host_names[a], params, args)
                        r = impl(*args)
                        tr = type(r)
                        if tr is str or tr is bytes:
                            n += len(r) >> shift
                        elif tr is list:
                            n += len(r) << 3 >> shift
                        push(r)
                    elif op == CALL:
                        callee = fns[a]
                        if len(frames) >= max_depth:
                            raise VmBudgetExceeded(f"call depth of {max_depth} exceeded (runaway recursion?)")
                        if n > limit:
                            raise VmBudgetExceeded(f"instruction budget of {limit} used up")
                        args = stack[len(stack) - b:]
                        del stack[len(stack) - b:]
                        for v, t, name in zip(args, callee.arg_types, callee.fn.arg_names):
                            if t is not None and type(v) is not t:
                                raise VmRuntimeError(f"fn '{callee.name}' argument '{name}' must be "
                                                     f"{type_name_of(t)}, got {type_name(v)}")
                        frames.append((rec, code, consts, slots, pc))
                        rec = callee
                        code = callee.code
                        consts = callee.consts
                        slots = args
                        slots.extend([None] * (callee.num_slots - b))
                        pc = 0
                    elif op == RETURN:
                        v = pop()
                        t = rec.ret_type
                        if t is not None and type(v) is not t:
                            raise VmRuntimeError(f"fn '{rec.name}' must return {rec.fn.ret_type}, "
                                                 f"got {type_name(v)}")
                        if not frames:
                            return v, n
                        rec, code, consts, slots, pc = frames.pop()
                        push(v)
                    elif op == POP:
                        pop()
                    else:  # JUMP
                        pc = a
                elif op <= SHR:  # SUB MUL DIV MOD NE LE GT GE BAND BOR BXOR SHL SHR
                    y = pop()
                    x = stack[-1]
                    if type(x) is int and type(y) is int:
                        if op == SUB:
                            r = x - y
                        elif op == NE:
                            stack[-1] = x != y
                            continue
                        elif op == LE:
                            stack[-1] = x <= y
                            continue
                        elif op == GT:
                            stack[-1] = x > y
                            continue
                        elif op == GE:
                            stack[-1] = x >= y
                            continue
                        elif op == MUL:
                            r = x * y
                        elif op == MOD and x >= 0 and y > 0:
                            r = x % y
                        elif op == DIV and x >= 0 and y > 0:
                            r = x // y
                        else:
                            r = _int_op(op, x, y)
                        if not -INT_LIMIT < r < INT_LIMIT:
                            raise _int_overflow(r)
                        stack[-1] = r
                    else:
                        stack[-1] = binary(op, x, y)
                elif op == NOT:
                    c = stack[-1]
                    if type(c) is not bool:
                        raise VmRuntimeError(f"'!' needs a bool, got {type_name(c)}")
                    stack[-1] = not c
                elif op == AND_JUMP or op == OR_JUMP:
                    c = stack[-1]
                    if type(c) is not bool:
                        raise VmRuntimeError(f"'{'&&' if op == AND_JUMP else '||'}' needs bools, got {type_name(c)}")
                    if c is (op == OR_JUMP):
                        pc = a
                    else:
                        pop()
                elif op == CHECK_BOOL:
                    if type(stack[-1]) is not bool:
                        raise VmRuntimeError(f"'&&' and '||' need bools, got {type_name(stack[-1])}")
                elif op == NEG:
                    x = stack[-1]
                    if type(x) is not int and type(x) is not float:
                        raise VmRuntimeError(f"'-' needs an int or a float, got {type_name(x)}")
                    stack[-1] = -x
                elif op == INV:
                    x = stack[-1]
                    if type(x) is not int:
                        raise VmRuntimeError(f"'~' needs an int, got {type_name(x)}")
                    r = ~x
                    if not -INT_LIMIT < r < INT_LIMIT:
                        raise _int_overflow(r)
                    stack[-1] = r
                elif op == BUILD_LIST:
                    items = stack[len(stack) - a:]
                    del stack[len(stack) - a:]
                    push(items)
                elif op == BUILD_MAP:
                    m: dict = {}
                    base = len(stack) - 2 * a
                    for j in range(base, len(stack), 2):
                        k = stack[j]
                        if type(k) is not str:
                            raise VmRuntimeError(f"map keys are strs, got {type_name(k)}")
                        m[k] = stack[j + 1]
                    del stack[base:]
                    push(m)
                elif op == SET_INDEX:
                    v = pop()
                    i = pop()
                    x = pop()
                    _set_index(x, i, v, max_items)
                elif op == DUP2:
                    stack.extend(stack[-2:])
                elif op == ITER_INIT:
                    x = pop()
                    tx = type(x)
                    if tx is list or tx is dict:
                        x = tuple(x)  # the loop sees the elements (or keys) as they were when it started
                        n += (8 * len(x)) >> shift
                    elif tx is not str and tx is not bytes:
                        raise VmRuntimeError(f"cannot iterate over {type_name(x)}")
                    slots[a] = x
                    slots[a + 1] = 0
                elif op == RANGE_INIT:
                    hi = pop()
                    lo = pop()
                    if type(lo) is not int or type(hi) is not int:
                        raise VmRuntimeError(f"range bounds must be ints, got {type_name(lo)}..{type_name(hi)}")
                    slots[a] = lo
                    slots[a + 1] = hi
                elif op == EXPECT:
                    c = pop()
                    if c is not True:
                        if c is not False:
                            raise VmRuntimeError(f"expect needs a bool, got {type_name(c)}")
                        raise VmExpectFailed(f"expect failed: {rec.fn.expects[a].text}")
                else:  # EXPECT_CMP
                    y = pop()
                    x = pop()
                    if binary(b, x, y) is not True:
                        raise VmExpectFailed(f"expect failed: {rec.fn.expects[a].text} "
                                             f"(left: {show(x)}, right: {show(y)})")
        except VmError as exc:
            self._locate(exc, rec, pc, frames)
            raise
        except PolicyFailure as exc:
            fn = rec.fn
            exc.path, exc.line, exc.column = fn.path, fn.lines[pc - 1], fn.columns[pc - 1]
            raise
        except RecursionError:
            exc = VmRuntimeError("a value is nested too deeply")
            self._locate(exc, rec, pc, frames)
            raise exc from None
        except MemoryError:
            exc = VmMemoryExceeded("the host ran out of memory")
            self._locate(exc, rec, pc, frames)
            raise exc from None

    @staticmethod
    def _locate(exc: VmError, rec: _Fn, pc: int, frames: list[tuple]) -> None:
        fn = rec.fn
        at = max(pc - 1, 0)
        exc.locate(fn.path, fn.lines[at], fn.columns[at])
        trace = [f"{fn.path}:{fn.lines[at]}:{fn.columns[at]} in {fn.kind} {fn.name}"]
        for caller, _, _, _, caller_pc in reversed(frames):
            f = caller.fn
            trace.append(f"{f.path}:{f.lines[caller_pc - 1]}:{f.columns[caller_pc - 1]} in {f.kind} {f.name}")
        exc.trace = trace

    # ---- operators --------------------------------------------------------------------

    def _binary(self, op: int, x: Any, y: Any) -> Any:
        """Every binary operator, with the language's rules: both operands of one type, no
        implicit casts; integer `/` truncates and `%` follows the dividend, as constant folding does."""
        if op == Op.EQ:
            return values_equal(x, y)
        if op == Op.NE:
            return not values_equal(x, y)
        tx = type(x)
        if tx is not type(y):
            raise VmRuntimeError(f"operands of '{_SYMBOL[op]}' have different types {type_name(x)} and "
                                 f"{type_name(y)}; no implicit casts")
        if op in _ORDERING:
            if tx is not int and tx is not float and tx is not str:
                raise _undefined(op, x)
            return x < y if op == Op.LT else x <= y if op == Op.LE else x > y if op == Op.GT else x >= y
        if tx is int:
            return _int_op(op, x, y)
        if tx is float:
            return _float_op(op, x, y)
        if op == Op.ADD and (tx is str or tx is bytes or tx is list):
            size = len(x) + len(y)
            if tx is list:
                if size > self.host.max_items:
                    raise too_large("a list", size, self.host.max_items)
            elif size > self.host.max_chars:
                raise too_large(f"a {type_name(x)}", size, self.host.max_chars,
                                "characters" if tx is str else "bytes")
            return x + y
        raise _undefined(op, x)


def type_name_of(t: type) -> str:
    return TYPE_NAMES[t]


def _undefined(op: int, x: Any) -> VmRuntimeError:
    return VmRuntimeError(f"operator '{_SYMBOL[op]}' is not defined for {type_name(x)}")


def _int_overflow(r: int) -> VmRuntimeError:
    return VmRuntimeError(f"integer overflow: a {r.bit_length()}-bit result; control ints have at most "
                          f"{INT_BITS} bits")


def _int_op(op: int, x: int, y: int) -> int:
    if op == Op.ADD:
        r = x + y
    elif op == Op.SUB:
        r = x - y
    elif op == Op.MUL:
        r = x * y
    elif op == Op.DIV or op == Op.MOD:
        if y == 0:
            raise VmRuntimeError("integer division by zero" if op == Op.DIV else "integer remainder by zero")
        q = abs(x) // abs(y)
        q = q if (x >= 0) == (y >= 0) else -q  # truncate toward zero, like loomc.check.core._fold
        r = q if op == Op.DIV else x - y * q
    elif op == Op.BAND:
        r = x & y
    elif op == Op.BOR:
        r = x | y
    elif op == Op.BXOR:
        r = x ^ y
    elif op == Op.SHL or op == Op.SHR:
        if y < 0:
            raise VmRuntimeError(f"negative shift amount {y}")
        if op == Op.SHR:
            return x >> y if y < INT_BITS + 1 else (-1 if x < 0 else 0)
        if x and x.bit_length() + y > INT_BITS:
            raise VmRuntimeError(f"integer overflow: {x.bit_length()}-bit value << {y}; control ints have at most "
                                 f"{INT_BITS} bits")
        r = x << y
    else:
        raise _undefined(op, x)
    if not -INT_LIMIT < r < INT_LIMIT:
        raise _int_overflow(r)
    return r


def _float_op(op: int, x: float, y: float) -> float:
    if op == Op.ADD:
        return x + y
    if op == Op.SUB:
        return x - y
    if op == Op.MUL:
        return x * y
    if op == Op.DIV or op == Op.MOD:
        if y == 0.0:
            raise VmRuntimeError("float division by zero" if op == Op.DIV else "float remainder by zero")
        return x / y if op == Op.DIV else math.fmod(x, y)  # sign of the dividend, as constant folding does
    raise _undefined(op, x)


def _index(x: Any, i: Any) -> Any:
    tx = type(x)
    if tx is list or tx is str or tx is bytes:
        if type(i) is not int:
            raise VmRuntimeError(f"a {type_name(x)} index must be an int, got {type_name(i)}")
        if not 0 <= i < len(x):
            raise VmRuntimeError(f"index {i} is out of range for a {type_name(x)} of length {len(x)}")
        return x[i]
    if tx is dict:
        if type(i) is not str:
            raise VmRuntimeError(f"a map key must be a str, got {type_name(i)}")
        raise VmRuntimeError(f"key {show(i)} is not in the map (use has(m, key) first)")
    raise VmRuntimeError(f"cannot index {type_name(x)}" + (" with " + type_name(i) if x is not None else ""))


def _set_index(x: Any, i: Any, v: Any, max_items: int) -> None:
    tx = type(x)
    if tx is list:
        if type(i) is not int:
            raise VmRuntimeError(f"a list index must be an int, got {type_name(i)}")
        if not 0 <= i < len(x):
            raise VmRuntimeError(f"index {i} is out of range for a list of length {len(x)} (use append to grow it)")
        x[i] = v
    elif tx is dict:
        if type(i) is not str:
            raise VmRuntimeError(f"a map key must be a str, got {type_name(i)}")
        if i not in x and len(x) >= max_items:
            raise too_large("a map", len(x) + 1, max_items, "entries")
        x[i] = v
    else:
        raise VmRuntimeError(f"cannot assign into {type_name(x)}; only list and map elements are assignable")


def _host_arg_error(name: str, params: tuple, args: list) -> VmRuntimeError:
    for j, (v, t) in enumerate(zip(args, params)):
        if t is not None and type(v) is not t:
            return VmRuntimeError(f"{name}() argument {j + 1} must be {type_name_of(t)}, got {type_name(v)}")
    return VmRuntimeError(f"{name}(): bad arguments")  # pragma: no cover


__all__ = ["HostContext", "Vm"]

"""loomc/run/vm.py: the interpreter — every opcode's run-time rules, limits, errors and the call API."""

from __future__ import annotations

import itertools
import math

import pytest

from loomc.check import load_files
from loomc.check import types as T
from loomc.check.core import _fold
from loomc.lower.vm import compile_program
from loomc.run.errors import PolicyFailure, RunError, VmBudgetExceeded, VmError, VmMemoryExceeded, VmRuntimeError
from loomc.run.vm import HostContext, Vm


@pytest.fixture
def vm_of(tmp_path, monkeypatch):
    """Compile a source text (saved as p.loom in a temporary working directory) into a Vm."""
    monkeypatch.chdir(tmp_path)
    counter = itertools.count()

    def make(text: str, host: HostContext | None = None) -> Vm:
        path = tmp_path / f"p{next(counter)}.loom"
        path.write_text(text, encoding="utf-8")
        checked = load_files([path])
        assert checked.ok, [d.header() for d in checked.diagnostics]
        return Vm(compile_program(checked), host)

    return make


def expr_fn(body: str, args: str = "", ret: str = "any") -> str:
    return f"fn f({args}) -> {ret} {{\n{body}\n}}\n"


def ev(vm_of, expr: str, args: str = "", *values):
    """The value of one expression (of the arguments `args`)."""
    return vm_of(expr_fn(f"    return {expr}", args)).call("f", list(values))


# ---- arithmetic, comparison and logic ----------------------------------------------------


DIVISION_CASES = [(a, b) for a in (-7, -6, -1, 0, 1, 6, 7, 2 ** 70) for b in (-3, -2, 1, 2, 3, 2 ** 65)]


@pytest.mark.parametrize("op", ["/", "%"])
def test_integer_division_matches_constant_folding(vm_of, op):
    vm = vm_of(expr_fn(f"    return a {op} b", "a: int, b: int", "int"))
    for a, b in DIVISION_CASES:
        assert vm.call("f", [a, b]) == _fold(op, a, b, T.I64), (a, op, b)


def test_float_arithmetic_matches_constant_folding(vm_of):
    vm = vm_of(expr_fn("    return [a + b, a - b, a * b, a / b, a % b]", "a: float, b: float", "list"))
    for a, b in itertools.product((-7.5, -1.0, 0.0, 2.25), (-2.0, 0.5, 3.0)):
        assert vm.call("f", [a, b]) == [_fold(o, a, b, T.F32) for o in "+-*/%"]


def test_integer_operators(vm_of):
    got = ev(vm_of, "[a + 1, a - 10, a * 3, a & 6, a | 8, a ^ 1, a << 3, a >> 1, -a, ~a, (0 - a) >> 1]", "a: int", 5)
    assert got == [6, -5, 15, 4, 13, 4, 40, 2, -5, -6, -3]


def test_ints_are_wide_but_bounded(vm_of):
    assert ev(vm_of, "a + 1", "a: int", 18446744073709551615) == 2 ** 64
    for expr, arg in [("a * a", 2 ** 3000), ("a << 4000", 2 ** 200), ("a + a", 2 ** 4095), ("0 - a - a", 2 ** 4095),
                      ("~a", 2 ** 4096 - 1)]:
        with pytest.raises(VmRuntimeError, match="integer overflow"):
            ev(vm_of, expr, "a: int", arg)
    assert ev(vm_of, "a >> 100000", "a: int", -5) == -1


@pytest.mark.parametrize("expr, message", [
    ("a / 0", "integer division by zero"), ("a % 0", "remainder by zero"), ("a << -1", "negative shift"),
    ("a >> -1", "negative shift"),
])
def test_integer_errors(vm_of, expr, message):
    with pytest.raises(VmRuntimeError, match=message):
        ev(vm_of, expr, "a: int", 3)


def test_float_division_by_zero_is_an_error_and_overflow_is_inf(vm_of):
    with pytest.raises(VmRuntimeError, match="float division by zero"):
        ev(vm_of, "a / 0.0", "a: float", 1.0)
    with pytest.raises(VmRuntimeError, match="float remainder by zero"):
        ev(vm_of, "a % 0.0", "a: float", 1.0)
    assert ev(vm_of, "a * a", "a: float", 1e300) == math.inf


def test_no_implicit_casts_behind_any(vm_of):
    vm = vm_of(expr_fn("    return a + b", "a: any, b: any"))
    for a, b in [(1, 1.0), (True, 1), ("n=", 3), (b"x", "x"), ([1], "x"), (None, None), ({}, {})]:
        with pytest.raises(VmRuntimeError, match="different types|not defined"):
            vm.call("f", [a, b])
    for op in ["-", "*", "/", "%", "&", "|", "^", "<<", ">>", "<", "<=", ">", ">="]:
        with pytest.raises(VmRuntimeError):
            vm_of(expr_fn(f"    return a {op} b", "a: any, b: any")).call("f", ["x", "y"] if op not in "<<=>>=" else
                                                                        [1, 1.0])
    for op, operand in [("-", "x"), ("!", 1), ("~", 1.5)]:
        with pytest.raises(VmRuntimeError, match=f"'{op}' needs"):
            vm_of(expr_fn(f"    return {op}a", "a: any")).call("f", [operand])


def test_concatenation(vm_of):
    assert ev(vm_of, "[s + \"!\", b + b\"\\x00\", xs + [3], xs]", "s: str, b: bytes, xs: list", "hi", b"a",
              [1, 2]) == ["hi!", b"a\x00", [1, 2, 3], [1, 2]]


def test_comparisons(vm_of):
    vm = vm_of(expr_fn("    return [a < b, a <= b, a > b, a >= b, a == b, a != b]", "a: any, b: any", "list"))
    assert vm.call("f", [1, 2]) == [True, True, False, False, False, True]
    assert vm.call("f", [2.5, 2.5]) == [False, True, False, True, True, False]
    assert vm.call("f", ["b", "ab"]) == [False, False, True, True, False, True]
    with pytest.raises(VmRuntimeError, match="different types"):
        vm.call("f", [1, "1"])
    with pytest.raises(VmRuntimeError, match="not defined for list"):
        vm.call("f", [[1], [2]])


def test_equality_is_structural_and_type_strict(vm_of):
    vm = vm_of(expr_fn("    return [a == b, a != b]", "a: any, b: any", "list"))
    cases = [(1, 1.0, False), (0, False, False), (None, None, True), ([1, [2]], [1, [2]], True),
             ([1], [1.0], False), ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True), ({"a": True}, {"a": 1}, False),
             (math.nan, math.nan, False), ([math.nan], [math.nan], False), (b"x", b"x", True), ("x", b"x", False)]
    for a, b, equal in cases:
        assert vm.call("f", [a, b]) == [equal, not equal], (a, b)


def test_deeply_nested_or_cyclic_values_cannot_be_compared(vm_of):
    cyclic: list = []
    cyclic.append(cyclic)
    other: list = []
    other.append(other)
    with pytest.raises(VmRuntimeError, match="nested more than"):
        ev(vm_of, "a == b", "a: list, b: list", cyclic, other)


def test_short_circuit_skips_the_right_operand(vm_of):
    vm = vm_of("""
fn boom(log: list) -> bool {
    append(log, "ran")
    return true
}

fn f(a: bool, log: list) -> list {
    return [a && boom(log), a || boom(log)]
}
""")
    log: list = []
    assert vm.call("f", [False, log]) == [False, True] and log == ["ran"]
    log.clear()
    assert vm.call("f", [True, log]) == [True, True] and log == ["ran"]


def test_logic_operands_and_conditions_must_be_bools(vm_of):
    for expr, arg in [("a && true", 1), ("true && a", None), ("a || false", "x"), ("false || a", 0), ("!a", None)]:
        with pytest.raises(VmRuntimeError, match="bool"):
            ev(vm_of, expr, "a: any", arg)
    for stmt in ["if a {}", "while a {}"]:
        with pytest.raises(VmRuntimeError, match="condition must be a bool, got null"):
            vm_of(f"fn f(a: any) {{\n    {stmt}\n}}\n").call("f", [None])


# ---- values, indexing, loops -------------------------------------------------------------


def test_literals_build_fresh_containers(vm_of):
    vm = vm_of(expr_fn('    return {"xs": [1, 2.5, "s", b"b", true, null], "m": {}}', ret="map"))
    first, second = vm.call("f", []), vm.call("f", [])
    assert first == {"xs": [1, 2.5, "s", b"b", True, None], "m": {}}
    first["xs"].append(9)
    assert second["xs"] == [1, 2.5, "s", b"b", True, None]


def test_indexing(vm_of):
    args = "xs: list, s: str, b: bytes, m: map"
    assert ev(vm_of, "[xs[1], s[1], b[1], m[\"k\"]]", args, [1, 2], "héllo", b"\x00\xff", {"k": "v"}) == \
        [2, "é", 255, "v"]
    vm = vm_of(expr_fn("    return x[i]", "x: any, i: any"))
    for x, i, message in [([1], 1, "out of range"), ([1], -1, "out of range"), ("ab", 2, "out of range"),
                          ({}, "k", 'key "k" is not in the map'), ({}, 1, "map key must be a str"),
                          ([1], "0", "list index must be an int"), (None, 0, "cannot index null"),
                          (3, 0, "cannot index int with int")]:
        with pytest.raises(VmRuntimeError, match=message):
            vm.call("f", [x, i])


def test_index_assignment_and_compound_assignment(vm_of):
    vm = vm_of("""
fn f(xs: list, m: map) -> list {
    xs[0] = "a"
    xs[1] += 10
    m["new"] = 1
    m["n"] *= 3
    var s = "x"
    s += "y"
    var i = 7
    i -= 2
    i <<= 1
    return [xs, m, s, i]
}
""")
    xs, m = ["_", 5], {"n": 2}
    assert vm.call("f", [xs, m]) == [["a", 15], {"n": 6, "new": 1}, "xy", 10]
    assert xs == ["a", 15] and m == {"n": 6, "new": 1}  # shared by reference with the host
    bad = vm_of("fn g(x: any, i: any) {\n    x[i] = 1\n}\n")
    for x, i, message in [([], 0, "use append"), ({}, 3, "map key must be a str"), ("s", 0, "cannot assign into str"),
                          ([1], "a", "list index must be an int")]:
        with pytest.raises(VmRuntimeError, match=message):
            bad.call("g", [x, i])


def test_var_without_value_starts_at_the_zero_of_its_type(vm_of):
    vm = vm_of(expr_fn("""    var a: int
    var b: float
    var c: str
    var d: bytes
    var e: bool
    var f: list
    var g: map
    var h
    append(f, 1)
    return [a, b, c, d, e, f, g, h]""", ret="list"))
    assert vm.call("f", []) == [0, 0.0, "", b"", False, [1], {}, None]
    assert vm.call("f", [])[5] == [1]  # a fresh list each time


def test_for_loops_over_every_iterable(vm_of):
    vm = vm_of("""
fn f(xs: list, m: map, s: str, b: bytes) -> list {
    var out = []
    for x in xs {
        append(out, x)
    }
    for k in m {
        append(out, k)
    }
    for c in s {
        append(out, c)
    }
    for v in b {
        append(out, v)
    }
    for i in 2..5 {
        append(out, i)
    }
    for i in 5..2 {
        append(out, i)
    }
    return out
}
""")
    assert vm.call("f", [[1, None], {"z": 1, "a": 2}, "hé", b"\x01\x02"]) == \
        [1, None, "z", "a", "h", "é", 1, 2, 2, 3, 4]
    with pytest.raises(VmRuntimeError, match="cannot iterate over int"):
        vm_of("fn g(x: any) {\n    for v in x {}\n}\n").call("g", [3])
    with pytest.raises(VmRuntimeError, match="range bounds must be ints"):
        vm_of("fn g(x: any) {\n    for i in 0..x {}\n}\n").call("g", [2.0])


def test_loops_iterate_over_a_snapshot(vm_of):
    vm = vm_of("""
fn f(xs: list, m: map) -> int {
    var n = 0
    for x in xs {
        append(xs, x)
        n += 1
    }
    for k in m {
        m[k + "!"] = 1
        n += 1
    }
    return n
}
""")
    xs, m = [1, 2], {"a": 1}
    assert vm.call("f", [xs, m]) == 3 and xs == [1, 2, 1, 2] and m == {"a": 1, "a!": 1}


def test_range_bounds_are_evaluated_once(vm_of):
    vm = vm_of(expr_fn("""    var n = 3
    var seen = 0
    for i in 0..n {
        n = 10
        seen += 1
    }
    return seen""", ret="int"))
    assert vm.call("f", []) == 3


def test_while_break_continue_and_if_chains(vm_of):
    vm = vm_of("""
fn classify(x: int) -> str {
    if x < 0 {
        return "negative"
    } else if x == 0 {
        return "zero"
    } else if x < 10 {
        return "small"
    } else {
        return "large"
    }
}

fn f() -> list {
    var out = []
    var i = 0
    while true {
        i += 1
        if i % 2 == 0 {
            continue
        }
        if i > 9 {
            break
        }
        append(out, i)
    }
    for j in 0..10 {
        if j == 3 {
            break
        }
        append(out, classify(j * 7 - 7))
    }
    return out
}
""")
    assert vm.call("f", []) == [1, 3, 5, 7, 9, "negative", "zero", "small"]


# ---- calls -----------------------------------------------------------------------------


def test_recursion_and_call_depth(vm_of):
    vm = vm_of("""
fn fib(n: int) -> int {
    if n < 2 {
        return n
    }
    return fib(n - 1) + fib(n - 2)
}

fn down(n: int) -> int {
    return down(n + 1)
}
""", HostContext(max_call_depth=50))
    assert vm.call("fib", [15]) == 610
    with pytest.raises(VmBudgetExceeded, match="call depth of 50") as info:
        vm.call("down", [0])
    assert len(info.value.trace) == 51 and info.value.trace[0].endswith("in fn down")


def test_arguments_and_results_are_checked_at_fn_boundaries(vm_of):
    vm = vm_of("""
fn want_str(s: str) -> int {
    return len(s)
}

fn give(x: any) -> str {
    return x
}

fn pass_on(x: any) -> int {
    return want_str(x)
}

fn nothing(x: any) {
    return x
}
""")
    assert vm.call("pass_on", ["abc"]) == 3
    with pytest.raises(VmRuntimeError, match="argument 's' must be str, got int"):
        vm.call("pass_on", [3])
    with pytest.raises(VmRuntimeError, match="must return str, got int"):
        vm.call("give", [3])
    with pytest.raises(VmRuntimeError, match="must return null, got int"):
        vm.call("nothing", [3])
    assert vm.call("nothing", [None]) is None
    with pytest.raises(VmRuntimeError, match=r"p0.loom:2:4: fn 'want_str' argument 's' must be str, got bytes"):
        vm.call("want_str", [b"x"])
    with pytest.raises(VmRuntimeError, match="takes 1 argument, got 2"):
        vm.call("want_str", ["a", "b"])
    with pytest.raises(VmRuntimeError, match="no fn named 'missing'"):
        vm.call("missing", [])
    assert vm.has("give") and not vm.has("missing")
    assert vm.call("p0.loom::give", ["q"]) == "q"


def test_a_shadowed_fail_does_not_end_a_path(tmp_path):
    # A module fn named `fail` hides the host's; the checker then sees f fall off its end.
    from loomc.check import check_files

    path = tmp_path / "p0.loom"
    path.write_text("fn fail(a: int, b: str) {}\n\nfn f() -> int {\n    fail(1, \"shadowed\")\n}\n")
    diagnostics, _ = check_files([path])
    assert [(d.code, d.line, d.column) for d in diagnostics] == [("L0312", 5, 1)]


# ---- fail, errors, limits ----------------------------------------------------------------


def test_fail_surfaces_status_and_message(vm_of):
    vm = vm_of("fn judge(t: float) {\n    if t > 2.0 {\n        fail(400, \"bad temperature\")\n    }\n}\n\n"
               "fn busy() {\n    fail(503, \"try later\")\n}\n\nfn wrong() {\n    fail(200, \"fine\")\n}\n")
    assert vm.call("judge", [1.0]) is None
    with pytest.raises(PolicyFailure) as info:
        vm.call("judge", [3.0])
    err = info.value
    assert (err.status, err.message, err.code) == (400, "bad temperature", "policy_failure")
    assert (err.path, err.line, err.column) == ("p0.loom", 3, 9)
    with pytest.raises(PolicyFailure) as info:
        vm.call("busy", [])
    assert info.value.status == 503
    with pytest.raises(VmRuntimeError, match="status must be in 400..599, got 200"):
        vm.call("wrong", [])


def test_runtime_errors_carry_path_line_and_column(vm_of):
    vm = vm_of("fn inner(m: any) -> any {\n    return m[\"k\"]\n}\n\nfn outer() -> any {\n    return inner(null)\n}\n")
    with pytest.raises(VmRuntimeError) as info:
        vm.call("outer", [])
    err = info.value
    assert str(err) == "p0.loom:2:14: cannot index null"
    assert (err.path, err.line, err.column, err.code) == ("p0.loom", 2, 14, "control_runtime_error")
    assert err.trace == ["p0.loom:2:14 in fn inner", "p0.loom:6:12 in fn outer"]
    assert isinstance(err, VmError) and isinstance(err, RunError)


def test_an_endless_loop_uses_up_the_budget(vm_of):
    vm = vm_of("fn spin() {\n    while true {}\n}\n\nfn count(n: int) -> int {\n    var i = 0\n"
               "    while i < n {\n        i += 1\n    }\n    return i\n}\n")
    with pytest.raises(VmBudgetExceeded) as info:
        vm.call("spin", [])
    assert info.value.code == "control_budget_exceeded"
    assert str(info.value).startswith("p0.loom:2:5: instruction budget of 1000000 used up")
    with pytest.raises(VmBudgetExceeded, match="budget of 50 "):
        vm.call("count", [100], budget=50)
    value, used = vm.call_counted("count", [10])
    assert value == 10 and used == 2 + 9 * 10 + 4 + 2  # set-up, 9 per iteration, the last test, return


def test_runaway_growth_ends_cleanly(vm_of):
    host = HostContext(max_value_bytes=1 << 16)
    vm = vm_of("""
fn strings() {
    var s = "ab"
    while true {
        s = s + s
    }
}

fn lists() {
    var xs = [1]
    while true {
        xs = xs + xs
    }
}

fn appends() {
    var xs = []
    while true {
        append(xs, 1)
    }
}

fn keys() {
    var m = {}
    var i = 0
    while true {
        m[str(i)] = i
        i += 1
    }
}
""", host)
    for name in ("strings", "lists", "appends", "keys"):
        with pytest.raises(VmMemoryExceeded) as info:
            vm.call(name, [], budget=10 ** 8)
        assert info.value.code == "control_memory_exceeded" and isinstance(info.value, VmBudgetExceeded)


def test_allocation_costs_instructions(vm_of):
    vm = vm_of(expr_fn("    return s + s", "s: str", "str"))
    _, small = vm.call_counted("f", ["x"])
    _, large = vm.call_counted("f", ["x" * 100_000])
    assert large - small == 200_000 >> 8


def test_error_classes():
    with pytest.raises(ValueError):
        PolicyFailure(200, "no")
    with pytest.raises(ValueError):
        PolicyFailure(True, "no")
    err = VmRuntimeError("x").locate("a.loom", 3, 4)
    assert str(err.locate("b.loom", 9, 9)) == "a.loom:3:4: x"  # located once


def test_straight_line_calls_check_the_budget_too(vm_of):
    vm = vm_of("fn a() -> int {\n    return b() + b()\n}\n\nfn b() -> int {\n    return 1 + 1 + 1 + 1\n}\n")
    assert vm.call("a", []) == 8
    with pytest.raises(VmBudgetExceeded, match="budget of 5 used up"):
        vm.call("a", [], budget=5)


def test_bare_return_and_map_keys_behind_any(vm_of):
    vm = vm_of("fn note(log: list, line: str) {\n    if line == \"\" {\n        return\n    }\n"
               "    append(log, line)\n}\n\nfn keyed(k: any) -> map {\n    return {k: 1}\n}\n")
    log: list = []
    assert vm.call("note", [log, ""]) is None and vm.call("note", [log, "x"]) is None and log == ["x"]
    assert vm.call("keyed", ["a"]) == {"a": 1}
    with pytest.raises(VmRuntimeError, match="map keys are strs, got int"):
        vm.call("keyed", [1])


def test_expect_needs_a_bool(vm_of):
    vm = vm_of("fn one() -> any {\n    return 1\n}\n\ncheck c {\n    expect one()\n}\n")
    with pytest.raises(VmRuntimeError, match=r"p0.loom:6:5: expect needs a bool, got int"):
        vm.run_check(vm.program.checks[0])


def test_comparing_huge_shared_structures_is_bounded(vm_of):
    a: list = [1]
    b: list = [1]
    for _ in range(30):
        a, b = [a, a], [b, b]  # 2^30 leaves each, built separately so no pair is identical
    with pytest.raises(VmBudgetExceeded, match="visits more than"):
        ev(vm_of, "a == b", "a: list, b: list", a, b)


def test_the_interpreter_names_opcodes_in_declaration_order():
    """`_run` unpacks the opcodes into locals by position; the names must follow Op's order."""
    import ast as pyast
    import inspect
    import textwrap

    from loomc.lower.vm import Op
    from loomc.run import vm as vm_module

    tree = pyast.parse(textwrap.dedent(inspect.getsource(vm_module.Vm._run)))
    unpack = next(node for node in pyast.walk(tree) if isinstance(node, pyast.Assign)
                  and isinstance(node.value, pyast.Name) and node.value.id == "_OPS")
    assert [t.id for t in unpack.targets[0].elts] == [op.name for op in Op]

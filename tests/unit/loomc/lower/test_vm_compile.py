"""loomc/lower/vm.py: checked fn/check ASTs → VmProgram (code layout, constants, line table, entry names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loomc.check import load_files
from loomc.check.document import load_document
from loomc.lower.vm import Op, VmCompileError, VmProgram, compile_program, disassemble

# One program that makes the compiler emit every opcode at least once.
EVERY_OP = """
config limit: i64 = 3

fn helper(x: int) -> int {
    return x
}

fn everything(xs: list, m: map, s: str, b: bytes, f: float) -> any {
    var n = 0
    var total: int
    for x in xs {
        n = n + 1
    }
    for i in 0..limit {
        if i == 1 {
            continue
        }
        total += i
    }
    while n < 10 && has(m, "k") || total > 0 && m["flag"] {
        n += 1
        if n >= 5 {
            break
        }
    }
    xs[0] = [1, 2]
    m["k"] += 1
    let r = [n - 1, n != 2, n * 2, n / 2, n % 2, n <= 1, n & 1, n | 1, n ^ 1, n << 1, n >> 1, -n, ~n, !true, f, b]
    let v = {"k": helper(r[0]), "s": s + "!"}
    append(xs, v)
    return xs
}

check covers_expect {
    expect everything([0], {"k": 1, "flag": false}, "s", b"b", 1.0) != null
    expect true
}
"""


def compile_source(tmp_path: Path, text: str, name: str = "p.loom") -> VmProgram:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    checked = load_files([path])
    assert checked.ok, [d.header() for d in checked.diagnostics]
    return compile_program(checked)


def used_ops(program: VmProgram) -> set[Op]:
    return {Op(op) for f in program.functions + program.checks for op, _, _ in f.code}


def test_the_instruction_set_is_closed_and_dense():
    assert [int(op) for op in Op] == list(range(len(Op)))


def test_every_opcode_is_emitted_by_some_construct(tmp_path):
    program = compile_source(tmp_path, EVERY_OP)
    assert used_ops(program) == set(Op)


def test_a_program_with_errors_does_not_compile(tmp_path):
    path = tmp_path / "bad.loom"
    path.write_text("fn f() -> int {\n    return \"x\"\n}\n", encoding="utf-8")
    with pytest.raises(VmCompileError) as info:
        compile_program(load_files([path]))
    assert info.value.diagnostics and "L0311" in str(info.value)


def test_line_table_covers_every_instruction(tmp_path):
    program = compile_source(tmp_path, EVERY_OP)
    for f in program.functions + program.checks:
        assert len(f.lines) == len(f.code) == len(f.columns)
        assert all(f.line <= line <= EVERY_OP.count("\n") + 1 for line in f.lines)


def test_constants_keep_types_apart_and_are_shared(tmp_path):
    program = compile_source(tmp_path, """
fn f() -> list {
    return [1, 1.0, true, 1, "1", b"1", null, 0.0, -0.0]
}
""")
    consts = program.function("f").consts
    assert [type(c) for c in consts] == [int, float, bool, str, bytes, type(None), float]
    assert consts.count(1) == 3  # 1, 1.0 and True compare equal in Python but stay separate constants


def test_configs_are_folded_constants_with_document_overrides(tmp_path):
    (tmp_path / "c.loom").write_text("config n: i64 = 2 * 3\nconfig t: f32 = 1\n\nfn g() -> list {\n"
                                     "    return [n, t]\n}\n", encoding="utf-8")
    program = compile_program(load_files([tmp_path / "c.loom"]))
    assert program.function("g").consts == [6, 1.0, None]  # None: the implicit `return null` at the end
    (tmp_path / "model.json").write_text(json.dumps({"model": "m", "kind": "text", "control": "c.loom",
                                                     "config": {"n": 9}}), encoding="utf-8")
    program = compile_program(load_document(tmp_path / "model.json"))
    assert program.function("g").consts == [9, 1.0, None]


def test_while_true_has_no_condition_and_bool_operands_need_no_check(tmp_path):
    program = compile_source(tmp_path, """
fn spin() {
    while true {}
}

fn both(a: bool, m: map, x: any) -> bool {
    return a && has(m, "k") || (a && x)
}
""")
    assert [Op(op) for op, _, _ in program.function("spin").code] == [Op.LOOP, Op.CONST, Op.RETURN]
    ops = [Op(op) for op, _, _ in program.function("both").code]
    assert ops.count(Op.CHECK_BOOL) == 1  # only `x`, whose type is not known


def test_for_loops_use_hidden_state_slots(tmp_path):
    program = compile_source(tmp_path, "fn f(xs: list) {\n    for x in xs {}\n    for i in 0..3 {}\n}\n")
    f = program.function("f")
    assert f.num_slots == 1 + 2 + 1 + 2 + 1  # argument, (state, loop var) twice
    steps = [(Op(op), a, b) for op, a, b in f.code if op in (Op.ITER_NEXT, Op.RANGE_NEXT)]
    for op, slot, exit_at in steps:
        assert Op(f.code[exit_at - 1][0]) == Op.LOOP  # the exit lands just after the back edge


def test_expectations_record_position_and_text(tmp_path):
    program = compile_source(tmp_path, "check c {\n    expect 1 + 1 == 2\n    expect (true)\n}\n")
    (check,) = program.checks
    assert [(e.line, e.column, e.text) for e in check.expects] == [(2, 5, "1 + 1 == 2"), (3, 5, "(true)")]
    assert Op.EXPECT_CMP in {Op(op) for op, _, _ in check.code}


def test_entry_names_and_qualified_names(tmp_path):
    (tmp_path / "a.loom").write_text("fn dup() -> int {\n    return 1\n}\n\nfn only_a() {}\n", encoding="utf-8")
    (tmp_path / "b.loom").write_text("fn dup() -> int {\n    return 2\n}\n", encoding="utf-8")
    checked = load_files([tmp_path / "a.loom", tmp_path / "b.loom"])
    program = compile_program(checked)
    assert program.function("only_a").name == "only_a"
    with pytest.raises(KeyError, match="several modules"):
        program.function("dup")
    qualified = [f.qualname for f in program.functions if f.name == "dup"]
    assert len(qualified) == 2 and program.function(qualified[1]).qualname == qualified[1]
    with pytest.raises(KeyError, match="no fn named"):
        program.function("nope")


def test_a_document_exposes_its_control_program_only(repo):
    program = compile_program(load_document(repo / "samples" / "scout" / "model.json"))
    assert {"render", "validate_sampling", "stop_token_ids", "chat_request", "publish"} <= set(program.entry)
    assert all(program.functions[i].path.endswith("control.loom") for i in program.entry.values())
    assert len(program.checks) == 10 and program.instruction_count() > 100


def test_calls_resolve_to_fns_before_host_functions(tmp_path):
    program = compile_source(tmp_path, """
fn len(x: any) -> int {
    return 7
}

fn f(s: str) -> int {
    return len(s) + int(s)
}
""")
    f = program.function("f")
    ops = [(Op(op), a) for op, a, _ in f.code]
    assert (Op.CALL, 0) in ops  # `len` is the module's fn
    assert program.host_names == ("int",)


def test_disassembly_lists_every_instruction(tmp_path):
    program = compile_source(tmp_path, EVERY_OP)
    text = disassemble(program.function("everything"))
    assert text.count("\n") == len(program.function("everything").code)
    assert "ITER_NEXT" in text and "CALL_HOST" in text


def test_an_expectation_over_several_lines_keeps_its_text(tmp_path):
    program = compile_source(tmp_path, "check c {\n    expect 1 + 1\n        == 2\n    expect !false\n}\n")
    assert [e.text for e in program.checks[0].expects] == ["1 + 1 == 2", "!false"]
    assert Op.CHECK_BOOL not in used_ops(compile_source(tmp_path, "fn f(a: bool) -> bool {\n"
                                                                  "    return a && !a\n}\n", "q.loom"))

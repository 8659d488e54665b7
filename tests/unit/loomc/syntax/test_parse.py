"""loomc.syntax.parse: the grammar covers the language and errors are single positioned diagnostics."""

import pytest

from loomc.syntax import ast
from loomc.syntax.diagnostics import LoomSyntaxError
from loomc.syntax.parse import parse_module

EVERY_CONSTRUCT = '''
use "config.loom" { layers, dim as d, }
config eps: f32 = 1e-5
config big: u64 = 0xFFFF_FFFF
param wq[l in 0..layers]: q4_1[dim, dim] = checkpoint("blk.{l}.attn_q.weight")
state kv: f16[layers, 16, 64] per page
kernel rmsnorm(x: f32[T, D], w: f32[D], eps: f32, out y: f32[T, D]) {
    parallel for t in 0..T, u in 0..2 {
        var ss: f32 = 0.0
        for d in 0..D { ss += x[t, d] * x[t, d] }
        let r = rsqrt(ss / f32(D) + eps)
        let b = bitcast[u32](r) >> 3 & 0xff
    }
}
stage decode(tokens: i32[T]) -> (next: i32[R])
command decode(tokens: i32[T]) -> (next: i32[R]) { var h: f32[T, 4] }
fn render(request: map) -> str {
    var out = ""
    for m in request["messages"] { out = out + m["role"] + "\\n" }
    while false { break }
    if len(out) == 0 && !true { fail(400, "x") } else if 1 < 2 { return null } else { out = "\\u{1F600}" }
    return out
}
check c { expect render({"messages": [1, 2.5, b"x", null, true]}) == "" }
'''


def test_every_item_kind_parses():
    m = parse_module(EVERY_CONSTRUCT, "all.loom")
    kinds = [type(i).__name__ for i in m.items]
    assert kinds == ["Use", "Config", "Config", "Param", "State", "Kernel", "Stage", "Command", "Fn", "Check"]


def test_literals_decode():
    m = parse_module(EVERY_CONSTRUCT, "all.loom")
    assert m.items[2].value.value == 0xFFFFFFFF
    assert m.items[1].value.value == pytest.approx(1e-5)
    fn = m.items[8]
    last_if = fn.body.stmts[3]
    assert last_if.orelse.orelse.stmts[0].value.value == "\U0001F600"


def test_precedence_is_python_like():
    m = parse_module("fn f() { let x = 1 + 2 * 3 == 7 && a | b & c }")
    e = m.items[0].body.stmts[0].value
    assert e.op == "&&"
    assert e.left.op == "==" and e.left.left.op == "+" and e.left.left.right.op == "*"
    assert e.right.op == "|" and e.right.right.op == "&"


def test_mode_words_are_ordinary_names_elsewhere():
    m = parse_module('fn f() -> str { var out = "" return out }')
    assert isinstance(m.items[0].body.stmts[0], ast.Var)


def test_comments_are_collected():
    m = parse_module("// head\nconfig a: i64 = 1  // tail\n")
    assert [(c.text, c.line, c.trailing) for c in m.comments] == [("// head", 1, False), ("// tail", 2, True)]


@pytest.mark.parametrize("src,line,col,code", [
    ('fn f() { let x = "abc }', 1, 18, "L0102"),
    ("fn f() { x @ 1 }", 1, 12, "L0101"),
    ("fn f() {", 1, 9, "L0103"),
    ('fn f() { let x = "a\\q" }', 1, 20, "L0104"),
    ("kernel k(foo x: f32) {}", 1, 10, "L0105"),
    ("config x: u64 = 0x1_0000_0000_0000_0000", 1, 17, "L0106"),
    ('fn f() { let b = b"\u20ac" }', 1, 20, "L0104"),
    ("config x: i64 = " + "9" * 5000, 1, 17, "L0106"),
    ("config x: i64 = " + " + ".join(["1"] * 3000), 1, 17, "L0109"),
    # A line that starts with '(' or '[' must not silently continue the previous line.
    ("fn f() {\n    x = a\n    (b)\n}", 3, 5, "L0107"),
    ("fn f() {\n    x = a\n    [1]\n}", 3, 5, "L0107"),
    ("fn f() {\n    var x: f32\n    [1]\n}", 3, 5, "L0107"),
    ("fn f() {\n    return\n    log(x)\n}", 3, 5, "L0108"),
])
def test_syntax_errors_are_positioned(src, line, col, code):
    with pytest.raises(LoomSyntaxError) as info:
        parse_module(src, "bad.loom")
    d = info.value.diagnostic
    assert (d.path, d.line, d.column, d.code) == ("bad.loom", line, col, code)


def test_continuation_lines_inside_brackets_and_after_operators_are_fine():
    m = parse_module("fn f() {\n    let x = g(1,\n        2)\n    let y = a\n        + b\n}")
    assert [type(s).__name__ for s in m.items[0].body.stmts] == ["Let", "Let"]


def test_leading_zeros_do_not_count_against_the_literal_limit():
    m = parse_module("config x: i64 = " + "0" * 5000 + "7")
    assert m.items[0].value.value == 7

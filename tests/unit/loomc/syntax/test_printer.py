"""Example-based tests for the canonical formatter: exact expected text, comments, idempotence."""

from __future__ import annotations

import textwrap

import pytest

from loomc.syntax import ast
from loomc.syntax.parse import parse_module
from loomc.syntax.printer import format_module, format_source


def dedent(s: str) -> str:
    return textwrap.dedent(s).lstrip("\n")


def check_round_trip(src: str, expected: str) -> None:
    """Exact output, idempotence, same AST, and every comment once and in order."""
    out = format_source(src)
    assert out == expected
    assert format_source(out) == out
    assert parse_module(out).items == parse_module(src).items
    assert [c.text for c in parse_module(out).comments] == [c.text for c in parse_module(src).comments]


REALISTIC_SRC = '''


// Tiny decoder layer.   
use "std/nn.loom" {silu,   softmax as sm,}
config  D : i32 = 0x100   // model width
config EPS: f32=1e-5
param W[l in 0..L]: f32[D,D] = zeros( D , D )
state kv: map per session



kernel rmsnorm(x: f32[T,D], w: f32[D], out y: f32[T,D]) {   // one row per thread
    parallel for t in 0..T,d in 0..D {
        var acc: f32 = 0.0
        for i in 0..D { acc += x[t,i]*x[t,i] }


        y[t,d] = x[t,d] / sqrt(acc/f32(D) + EPS) * w[d]  // normalise
    }
}
fn clamp(v: i32, lo: i32, hi: i32) -> i32 {

    if v<lo { return lo }
    else if v > hi { return hi } else { return v }

}
command generate(prompt: str) -> (text: str, n: i32) {
    var out = ""
    let tokens = encode(prompt)
    while len(tokens) < 16 && !done {
        tokens = append(tokens, bitcast[u32](1.0))
        if tokens[0] == 0 { break }
        // keep going
        continue
    }
    return {"text": out, "n": len(tokens)}
}
stage encode(text: str) -> (ids: i32[N])
check smoke {
    expect clamp(5, 0, 3) == 3   // upper bound
    expect -(1 + 2) * 3 == -9
}
// end of file


'''

REALISTIC_OUT = '''\
// Tiny decoder layer.
use "std/nn.loom" { silu, softmax as sm }
config D: i32 = 0x100  // model width
config EPS: f32 = 1e-5
param W[l in 0..L]: f32[D, D] = zeros(D, D)
state kv: map per session

kernel rmsnorm(x: f32[T, D], w: f32[D], out y: f32[T, D]) {
    // one row per thread
    parallel for t in 0..T, d in 0..D {
        var acc: f32 = 0.0
        for i in 0..D {
            acc += x[t, i] * x[t, i]
        }

        y[t, d] = x[t, d] / sqrt(acc / f32(D) + EPS) * w[d]  // normalise
    }
}
fn clamp(v: i32, lo: i32, hi: i32) -> i32 {
    if v < lo {
        return lo
    } else if v > hi {
        return hi
    } else {
        return v
    }
}
command generate(prompt: str) -> (text: str, n: i32) {
    var out = ""
    let tokens = encode(prompt)
    while len(tokens) < 16 && !done {
        tokens = append(tokens, bitcast[u32](1.0))
        if tokens[0] == 0 {
            break
        }
        // keep going
        continue
    }
    return {"text": out, "n": len(tokens)}
}
stage encode(text: str) -> (ids: i32[N])
check smoke {
    expect clamp(5, 0, 3) == 3  // upper bound
    expect -(1 + 2) * 3 == -9
}
// end of file
'''


def test_realistic_file() -> None:
    check_round_trip(REALISTIC_SRC, REALISTIC_OUT)


def test_realistic_output_is_a_fixed_point() -> None:
    assert format_source(REALISTIC_OUT) == REALISTIC_OUT


def test_trailing_comment_after_simple_statement_and_item() -> None:
    src = dedent("""
        config A: i32 = 1 // item trailing
        fn f() {
            let x = 1 // stmt trailing
            return x    //   spaced
        }
        stage s(a: f32) // stage trailing
    """)
    check_round_trip(src, dedent("""
        config A: i32 = 1  // item trailing
        fn f() {
            let x = 1  // stmt trailing
            return x  //   spaced
        }
        stage s(a: f32)  // stage trailing
    """))


def test_own_line_comments_are_reindented() -> None:
    src = dedent("""
        fn f() {
        // a
                // b
            x = 1
                    // c
        }
    """)
    check_round_trip(src, dedent("""
        fn f() {
            // a
            // b
            x = 1
            // c
        }
    """))


def test_comments_before_closing_brace_stay_inside_block() -> None:
    src = "fn f() {\n  if c {\n    x = 1\n    // last in then\n  }\n  // last in fn\n}\n"
    check_round_trip(src, dedent("""
        fn f() {
            if c {
                x = 1
                // last in then
            }
            // last in fn
        }
    """))


def test_block_with_only_comments_is_not_collapsed() -> None:
    check_round_trip("kernel k() {\n// todo\n}\ncheck c {   }\n", "kernel k() {\n    // todo\n}\ncheck c {}\n")


def test_trailing_comments_after_braces_become_own_line() -> None:
    src = dedent("""
        fn f() { // after open
            while x { // loop
                x -= 1
            } // after close
            if a {
                b()
            } // before else
            else {
                c()
            }
        } // after fn
        config Z: i32 = 0
    """)
    check_round_trip(src, dedent("""
        fn f() {
            // after open
            while x {
                // loop
                x -= 1
            }
            // after close
            if a {
                b()
            } else {
                // before else
                c()
            }
        }
        // after fn
        config Z: i32 = 0
    """))


def test_comments_inside_multiline_expression_follow_the_statement() -> None:
    src = dedent("""
        fn f() {
            let x = g(
                1, // first
                // own line inside
                2) // tail
            y = 3 // y
        }
    """)
    check_round_trip(src, dedent("""
        fn f() {
            let x = g(1, 2)
            // first
            // own line inside
            // tail
            y = 3  // y
        }
    """))


def test_two_statements_on_one_line_trailing_goes_to_the_last() -> None:
    check_round_trip("fn f() { a = 1 b = 2 // c\n}\n", "fn f() {\n    a = 1\n    b = 2  // c\n}\n")


def test_trailing_comment_after_statement_before_brace_on_same_line() -> None:
    check_round_trip("fn f() { a = 1 } // c\n", "fn f() {\n    a = 1\n}\n// c\n")


def test_else_if_chain() -> None:
    src = "fn f(x: i32) -> i32 { if x < 0 { return -1 } else if x == 0 { return 0 } else if x < 10 { return 1 }" \
          " else { return 2 } }\n"
    check_round_trip(src, dedent("""
        fn f(x: i32) -> i32 {
            if x < 0 {
                return -1
            } else if x == 0 {
                return 0
            } else if x < 10 {
                return 1
            } else {
                return 2
            }
        }
    """))


def test_empty_blocks_in_if_chain() -> None:
    check_round_trip("fn f() { if a { } else if b { } else { } }\n",
                     "fn f() {\n    if a {} else if b {} else {}\n}\n")


def test_nested_parentheses_are_kept_and_none_added() -> None:
    check_round_trip("fn f() { x = ((a + b)) * (c - (d)) }\n", "fn f() {\n    x = ((a + b)) * (c - (d))\n}\n")
    check_round_trip("fn f() { x = a - (b - c) - d << 2 | e & f == g }\n",
                     "fn f() {\n    x = a - (b - c) - d << 2 | e & f == g\n}\n")
    check_round_trip("fn f() { y = -(-x) + !(a || b) && ~m }\n",
                     "fn f() {\n    y = -(-x) + !(a || b) && ~m\n}\n")


def test_literals_keep_their_source_spelling() -> None:
    src = r'''fn f() { let a = 0xFF_ff + 0b1010 + 1_000 + 007
let b = 1.50e+3 + 2E-2 + 1_0.0_1
let s = "tab\t quote\" back\\ \u{1F600} \x41 // not a comment"
let y = b"\x00\xff\n" }
'''
    expected = r'''fn f() {
    let a = 0xFF_ff + 0b1010 + 1_000 + 007
    let b = 1.50e+3 + 2E-2 + 1_0.0_1
    let s = "tab\t quote\" back\\ \u{1F600} \x41 // not a comment"
    let y = b"\x00\xff\n"
}
'''
    check_round_trip(src, expected)
    assert parse_module(expected).comments == []


def test_blank_lines_collapsed_and_trimmed() -> None:
    src = "\n\n\nconfig A: i32 = 1\n\n\n\nconfig B: i32 = 2\nfn f() {\n\n\n  x = 1\n\n\n  // c\n\n  y = 2\n\n\n}\n\n\n"
    check_round_trip(src, dedent("""
        config A: i32 = 1

        config B: i32 = 2
        fn f() {
            x = 1

            // c

            y = 2
        }
    """))


def test_declarations_and_types() -> None:
    src = dedent("""
        use "a.loom" { }
        use "b.loom" { x as y , z }
        state s: f32[N,2] per request
        kernel k(a: bool, inout b: bf16[N], out c: q4_0[N/32]) {}
        command c() -> () {}
        command d(x: any) {}
        stage st()
        fn g(xs: list, m: map) { var v: int var w = [] var u = {} }
    """)
    check_round_trip(src, dedent("""
        use "a.loom" {}
        use "b.loom" { x as y, z }
        state s: f32[N, 2] per request
        kernel k(a: bool, inout b: bf16[N], out c: q4_0[N / 32]) {}
        command c() -> () {}
        command d(x: any) {}
        stage st()
        fn g(xs: list, m: map) {
            var v: int
            var w = []
            var u = {}
        }
    """))


def test_statements_and_expressions() -> None:
    src = dedent("""
        fn f() {
            for x in items { print(x) }
            for i in a+1..b*2 { v[i,0] <<= 1 }
            parallel for t in 0..T { m[t] %= 3 }
            while !(a>=b) { a += 1 }
            xs = [1,2,[3]]
            d = {"a":1,"b":{}}
            z = f32(x)(y)[0]
            expect x != null && y == false || true
            return
        }
    """)
    check_round_trip(src, dedent("""
        fn f() {
            for x in items {
                print(x)
            }
            for i in a + 1..b * 2 {
                v[i, 0] <<= 1
            }
            parallel for t in 0..T {
                m[t] %= 3
            }
            while !(a >= b) {
                a += 1
            }
            xs = [1, 2, [3]]
            d = {"a": 1, "b": {}}
            z = f32(x)(y)[0]
            expect x != null && y == false || true
            return
        }
    """))


def test_empty_module_and_comment_only_module() -> None:
    assert format_source("") == ""
    assert format_source("\n\n  \n") == ""
    check_round_trip("\n\n// only\n\n\n   // comments\n\n", "// only\n\n// comments\n")


def test_crlf_input() -> None:
    src = "fn f() {\r\n    x = 1 // a\r\n\r\n\r\n    y = 2\r\n}\r\n"
    assert format_source(src) == "fn f() {\n    x = 1  // a\n\n    y = 2\n}\n"


def test_format_module_on_a_built_ast() -> None:
    mod = ast.Module("<built>", [
        ast.Fn("f", [ast.ArgDecl("out", "y", ast.TensorTypeRef("f32", [ast.Name("N")]))], None, ast.Block([
            ast.Assign(ast.Index(ast.Name("y"), [ast.IntLit(0, "0")]), "=",
                       ast.Binary("*", ast.Paren(ast.Binary("+", ast.Name("a"), ast.Name("b"))), ast.Name("c"))),
        ])),
    ])
    text = format_module(mod)
    assert text == "fn f(out y: f32[N]) {\n    y[0] = (a + b) * c\n}\n"
    assert parse_module(text).items == mod.items


@pytest.mark.parametrize("src", [REALISTIC_SRC, REALISTIC_OUT, "fn f() { if a { } // x\n else { } }\n"])
def test_idempotent(src: str) -> None:
    once = format_source(src)
    assert format_source(once) == once

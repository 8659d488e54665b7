"""Example-driven syntax messages (lark's `match_examples`): each label owns minimal bad snippets.

The table is also test data: `tests/unit/loomc/syntax/test_error_examples.py`
asserts every snippet still produces its label, so the table cannot go stale.
"""

from __future__ import annotations

import functools

from lark.exceptions import UnexpectedInput

# (code, message) -> snippets that must produce it
SYNTAX_EXAMPLES: dict[tuple[str, str], list[str]] = {
    ("L0110", "expected ')' to close the parenthesis"): [
        "fn f() { g(1 }",
        "fn f() { let x = (1 + 2 }",
        "fn f() { g(a, b }",
    ],
    ("L0111", "expected ']' to close the brackets"): [
        "fn f() { let x = a[1 }",
        "fn f() { let x = [1, 2 }",
    ],
    ("L0112", "a parameter needs a type: write `name: type`"): [
        "fn f(x) { }",
        "kernel k(x, y) { }",
        "stage s(a) -> (b: i32)",
    ],
    ("L0113", "expected an item: use, config, param, state, kernel, command, stage, fn or check"): [
        "let x = 1",
        "x = 1",
        "return 1",
        "42",
    ],
    ("L0114", "expected '=' and a value"): [
        "config x: i64 30",
        "param w: f32[4] checkpoint(\"w\")",
    ],
    ("L0115", "expected a block '{ ... }'"): [
        "fn f() return 1",
        "kernel k(x: f32) x",
        "fn f() { if x return }",
        "fn f() { while x return }",
    ],
    ("L0116", "'=' assigns; use '==' to compare"): [
        "fn f() { if x = 1 { } }",
        "fn f() { while x = 1 { } }",
    ],
    ("L0117", "a range needs '..' between its bounds"): [
        "kernel k() { parallel for i in 0 { } }",
        "param w[l in 0]: f32[4] = checkpoint(\"w\")",
    ],
    ("L0118", "expected an expression"): [
        "fn f() { let x = }",
        "fn f() { let x = 1 + }",
        "fn f() { g(1, ) + }",
        "config x: i64 = ",
    ],
    ("L0119", "expected a type"): [
        "fn f(x: ) { }",
        "config x: = 1",
        "fn f() -> { }",
    ],
}


@functools.cache
def _parse_fn():
    from loomc.syntax.parse import parser

    return parser().parse


def match_example(exc: UnexpectedInput, text: str) -> tuple[str, str] | None:
    try:
        return exc.match_examples(_parse_fn(), SYNTAX_EXAMPLES, use_accepts=True)
    except Exception:  # a malformed example table must never turn a diagnostic into a traceback
        return None

"""Property tests: random ASTs print to text that parses back to the same AST, and formatting is idempotent.

The generator builds ASTs the parser could have produced: a Binary child that would
re-associate (or a comparison under a comparison) is wrapped in `ast.Paren`, names
avoid the grammar's reserved words, and statement sequences avoid the few
juxtapositions the newline-insensitive grammar would merge (see `_stmt_expr`).
"""

from __future__ import annotations

import functools
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomc.syntax import ast
from loomc.syntax.parse import parse_module, parser
from loomc.syntax.printer import format_module, format_source

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYWORDS = frozenset(
    t.pattern.value for t in parser().terminals
    if t.pattern.type == "str" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t.pattern.value)
)
NUM_TYPES = ["bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
             "f16", "bf16", "f32", "f64", "q4_0", "q4_1", "q8_0"]
DYN_TYPES = ["any", "int", "float", "str", "bytes", "list", "map"]

# Precedence levels, lowest to highest (binary ops are left-associative; comparisons are not associative).
LEVELS = [["||"], ["&&"], ["==", "!=", "<", "<=", ">", ">="], ["|"], ["^"], ["&"], ["<<", ">>"], ["+", "-"],
          ["*", "/", "%"]]
LEVEL = {op: i for i, ops in enumerate(LEVELS) for op in ops}
CMP = LEVEL["=="]
UNARY, POSTFIX, ATOM = len(LEVELS), len(LEVELS) + 1, len(LEVELS) + 2
BINOPS = sorted(LEVEL)
ASSIGN_OPS = ["=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="]


def test_keyword_set_matches_the_grammar() -> None:
    assert {"let", "in", "per", "as", "bitcast", "f32", "map", "null"} <= KEYWORDS
    assert not {"out", "inout", "b"} & KEYWORDS


# ---- leaves --------------------------------------------------------------------------------------

_first = st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_rest = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", max_size=5)
names = st.one_of(
    st.builds(lambda a, b: a + b, _first, _rest),
    st.sampled_from(["out", "inout", "b", "in_", "letx", "f32x", "i", "T"]),
).filter(lambda n: n not in KEYWORDS)


@st.composite
def int_lits(draw: st.DrawFn) -> ast.IntLit:
    v = draw(st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)))
    text = draw(st.sampled_from([str(v), f"{v:_}", f"0x{v:x}", f"0x{v:X}", f"0x{v:_x}", f"0b{v:b}", f"00{v}",
                                 f"{v}_"]))
    return ast.IntLit(v, text)


@st.composite
def float_lits(draw: st.DrawFn) -> ast.FloatLit:
    digits = st.from_regex(r"[0-9][0-9_]{0,3}", fullmatch=True)
    exp = draw(st.sampled_from(["", "e", "E", "e+", "e-", "E-"]))
    exp_text = exp + str(draw(st.integers(0, 400))) if exp else ""
    if exp and draw(st.booleans()):
        text = draw(digits) + exp_text
    else:
        text = f"{draw(digits)}.{draw(digits)}{exp_text}"
    return ast.FloatLit(float(text.replace("_", "")), text)


STR_PIECES = [("a", "a"), ("Z9 ", "Z9 "), ("\\n", "\n"), ("\\t", "\t"), ("\\r", "\r"), ("\\0", "\0"),
              ("\\\\", "\\"), ('\\"', '"'), ("\\'", "'"), ("\\x41", "A"), ("\\u{1F600}", "\U0001F600"),
              ("\\u{e9}", "\xe9"), ("é€", "é€"), ("//", "//"), ("{", "{")]
BYTES_PIECES = [("a", b"a"), ("\\x00", b"\x00"), ("\\xff", b"\xff"), ("\\n", b"\n"), ("\\\\", b"\\"),
                ('\\"', b'"'), ("//", b"//")]


def _pieces(table: list) -> st.SearchStrategy[tuple[str, object]]:
    return st.lists(st.sampled_from(table), max_size=4).map(
        lambda ps: ("".join(p[0] for p in ps), type(table[0][1])().join(p[1] for p in ps)))


str_lits = _pieces(STR_PIECES).map(lambda tv: ast.StrLit(tv[1], f'"{tv[0]}"'))
bytes_lits = _pieces(BYTES_PIECES).map(lambda tv: ast.BytesLit(tv[1], f'b"{tv[0]}"'))

leaves = st.one_of(
    names.map(ast.Name), int_lits(), float_lits(), str_lits, bytes_lits,
    st.booleans().map(ast.BoolLit), st.just(ast.NullLit()),
    st.sampled_from(NUM_TYPES + DYN_TYPES).map(ast.TypeName),
)


# ---- expressions with correct parenthesisation -------------------------------------------------


def prec(e: ast.Expr) -> int:
    if isinstance(e, ast.Binary):
        return LEVEL[e.op]
    if isinstance(e, ast.Unary):
        return UNARY
    if isinstance(e, (ast.Call, ast.Index)):
        return POSTFIX
    return ATOM


def wrap(e: ast.Expr, at_least: int) -> ast.Expr:
    """Parenthesise `e` when its precedence is below what its position requires."""
    return e if prec(e) >= at_least else ast.Paren(e)


def binary(op: str, left: ast.Expr, right: ast.Expr) -> ast.Binary:
    p = LEVEL[op]
    return ast.Binary(op, wrap(left, p + 1 if p == CMP else p), wrap(right, p + 1))


@functools.cache
def exprs(depth: int) -> st.SearchStrategy[ast.Expr]:
    if depth == 0:
        return leaves
    sub = exprs(depth - 1)
    some = st.lists(sub, max_size=3)
    return st.one_of(
        leaves,
        st.builds(binary, st.sampled_from(BINOPS), sub, sub),
        st.builds(binary, st.sampled_from(BINOPS), sub, sub),
        st.builds(lambda op, x: ast.Unary(op, wrap(x, UNARY)), st.sampled_from(["-", "!", "~"]), sub),
        st.builds(lambda f, a: ast.Call(wrap(f, POSTFIX), a), st.one_of(names.map(ast.Name), sub), some),
        st.builds(lambda b, i: ast.Index(wrap(b, POSTFIX), i), st.one_of(names.map(ast.Name), sub),
                  st.lists(sub, min_size=1, max_size=3)),
        some.map(ast.ListLit),
        st.lists(st.tuples(sub, sub), max_size=3).map(ast.MapLit),
        st.builds(ast.Bitcast, st.sampled_from(NUM_TYPES), sub),
        sub.map(ast.Paren),
    )


expr = exprs(3)
small_expr = exprs(1)


def first_token(e: ast.Expr) -> str:
    if isinstance(e, ast.Binary):
        return first_token(e.left)
    if isinstance(e, ast.Call):
        return first_token(e.callee)
    if isinstance(e, ast.Index):
        return first_token(e.base)
    if isinstance(e, ast.Unary):
        return e.op
    return {ast.Paren: "(", ast.ListLit: "[", ast.MapLit: "{"}.get(type(e), "atom")


def _stmt_expr(e: ast.Expr) -> ast.Expr:
    """An expression that may start a statement: one starting with `(`, `[` or `-` would be read as
    continuing the previous statement's expression (newlines are insignificant), so call it instead."""
    return ast.Call(ast.Name("f"), [e]) if first_token(e) in ("(", "[", "-") else e


# ---- types, statements and items ----------------------------------------------------------------

types = st.one_of(
    st.sampled_from(NUM_TYPES).map(ast.ScalarTypeRef),
    st.sampled_from(DYN_TYPES).map(ast.DynTypeRef),
    st.builds(ast.TensorTypeRef, st.sampled_from(NUM_TYPES), st.lists(small_expr, min_size=1, max_size=3)),
)
opt_types = st.none() | types
arg_decls = st.lists(st.builds(ast.ArgDecl, st.sampled_from([None, "out", "inout"]), names, types), max_size=3)

simple_stmts = st.one_of(
    st.builds(ast.Let, names, opt_types, expr),
    st.builds(ast.Var, names, opt_types, st.none() | expr),
    st.builds(ast.Assign, expr.map(_stmt_expr), st.sampled_from(ASSIGN_OPS), expr),
    st.builds(ast.ExprStmt, expr.map(_stmt_expr)),
    st.builds(ast.Return, expr),
    st.just(ast.Break()), st.just(ast.Continue()),
    st.builds(ast.Expect, expr),
)


@functools.cache
def blocks(depth: int) -> st.SearchStrategy[ast.Block]:
    stmt = simple_stmts if depth == 0 else st.one_of(simple_stmts, compound_stmts(depth))
    # A bare `return` would swallow a following expression statement, so it only ends a block.
    tail = st.lists(st.just(ast.Return(None)), max_size=1)
    return st.builds(lambda body, end: ast.Block(body + end), st.lists(stmt, max_size=4), tail)


@functools.cache
def ifs(depth: int) -> st.SearchStrategy[ast.If]:
    body = blocks(depth - 1)
    if depth <= 1:
        return st.builds(ast.If, expr, body, st.none() | body)
    return st.builds(ast.If, expr, body, st.none() | body | ifs(depth - 1))


@functools.cache
def compound_stmts(depth: int) -> st.SearchStrategy[ast.Stmt]:
    body = blocks(depth - 1)
    return st.one_of(
        ifs(depth),
        st.builds(ast.For, names, expr, st.none() | expr, body),
        st.builds(ast.ParallelFor, st.lists(st.builds(ast.RangeBind, names, expr, expr), min_size=1, max_size=3),
                  body),
        st.builds(ast.While, expr, body),
    )


body = blocks(2)
paths = st.text("abc/._-", max_size=8).map(lambda p: f'"{p}.loom"')
items = st.one_of(
    st.builds(lambda p, i: ast.Use(p[1:-1], p, i), paths,
              st.lists(st.builds(ast.ImportItem, names, st.none() | names), max_size=3)),
    st.builds(ast.Config, names, types, expr),
    st.builds(ast.Param, names, st.none() | st.builds(ast.Family, names, small_expr, small_expr), types, expr),
    st.builds(ast.State, names, types, names),
    st.builds(ast.Kernel, names, arg_decls, body),
    st.builds(ast.Command, names, arg_decls, st.none() | arg_decls, body),
    st.builds(ast.Stage, names, arg_decls, st.none() | arg_decls),
    st.builds(ast.Fn, names, arg_decls, opt_types, body),
    st.builds(ast.Check, names, body),
)
modules = st.lists(items, max_size=4).map(lambda its: ast.Module("<generated>", its))


# ---- properties ------------------------------------------------------------------------------------


@SETTINGS
@given(modules)
def test_generated_ast_round_trips(module: ast.Module) -> None:
    text = format_module(module)
    parsed = parse_module(text)  # (a) it parses
    assert parsed.items == module.items  # (b) same AST
    assert format_source(text) == text  # (c) canonical text is a fixed point


comment_texts = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=12
).map(lambda s: ("// " + s).rstrip())


@SETTINGS
@given(modules, st.data())
def test_inserted_comments_are_kept_in_order_and_formatting_is_idempotent(module: ast.Module,
                                                                           data: st.DataObject) -> None:
    lines = format_module(module).splitlines()
    mutated: list[str] = []
    inserted: list[str] = []
    for i in range(len(lines) + 1):
        for _ in range(data.draw(st.integers(0, 2), label="own-line comments")):
            if data.draw(st.booleans(), label="blank line"):
                mutated.append("")
            text = data.draw(comment_texts)
            inserted.append(text)
            mutated.append(" " * data.draw(st.integers(0, 9)) + text)
        if i < len(lines):
            line = lines[i]
            if data.draw(st.booleans(), label="blank line before code"):
                mutated.append("")
            if data.draw(st.booleans(), label="trailing comment"):
                text = data.draw(comment_texts)
                inserted.append(text)
                line += " " * data.draw(st.integers(0, 3)) + text
            mutated.append(line)
    source = "\n".join(mutated) + "\n"

    once = format_source(source)
    assert format_source(once) == once
    reparsed = parse_module(once)
    assert reparsed.items == module.items
    assert [c.text for c in reparsed.comments] == inserted
    # Comments and blank lines aside, the code lines are exactly the comment-free canonical lines.
    code = once.split("\n")
    for c in reversed(reparsed.comments):
        code[c.line - 1] = code[c.line - 1][: c.column - 1].rstrip()
    assert [line for line in code if line.strip()] == lines
    assert_canonical_layout(once, code)


def assert_canonical_layout(text: str, code: list[str]) -> None:
    """At most one blank line, none at the start of the file or a block, none before a `}`.

    `code` is `text` split into lines with the comments cut off (so a comment ending in `{` is not a block)."""
    assert text == "" or (text.endswith("\n") and not text.endswith("\n\n") and not text.startswith("\n"))
    out = text.split("\n")[:-1]
    for i in range(1, len(out)):
        prev, line = out[i - 1], out[i]
        assert line == line.rstrip()
        if line == "":
            assert prev != ""
            assert not code[i - 1].endswith("{")
            assert not (i + 1 < len(out) and out[i + 1].lstrip().startswith("}"))

"""Property tests: generated ASTs round-trip through .loombc, and the reader's shape rules are exact.

The AST generators are the printer's (`tests/unit/loomc/syntax/test_printer_properties.py`):
they build exactly the trees the parser can produce. For the shape rules we also build
trees the parser cannot produce (no parentheses added, statements juxtaposed freely) and
check that the reader rejects a tree exactly when its printed text would not parse
back to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "syntax"))
import test_printer_properties as gen  # noqa: E402 - the generators live beside the printer's tests

from bytecode_testlib import with_spans  # noqa: E402
from loomc.bytecode import LoomBytecodeError, read_module, write_module  # noqa: E402
from loomc.bytecode.writer import encode_items  # noqa: E402
from loomc.syntax import ast  # noqa: E402
from loomc.syntax.diagnostics import LoomSyntaxError  # noqa: E402
from loomc.syntax.parse import parse_module  # noqa: E402
from loomc.syntax.printer import format_module  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(gen.modules)
def test_generated_module_round_trips(module: ast.Module) -> None:
    data = write_module(module)
    back = read_module(data, "<generated>")
    assert back.items == module.items
    text = format_module(back)
    assert text == format_module(module)
    assert with_spans(back.items) == with_spans(parse_module(text).items)
    assert write_module(back) == data


# ---- trees the parser may not produce ------------------------------------------------------------

_leaf = st.one_of(gen.names.map(ast.Name), st.integers(0, 9).map(lambda v: ast.IntLit(v, str(v))),
                  st.just(ast.NullLit()), st.just(ast.ListLit([])))


@st.composite
def _raw_exprs(draw: st.DrawFn, depth: int = 2) -> ast.Expr:
    """Expressions with no parentheses added: half of them misparse when printed."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(_leaf)
    sub = _raw_exprs(depth - 1)
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return ast.Unary(draw(st.sampled_from(["-", "!", "~"])), draw(sub))
    if choice == 1:
        return ast.Call(draw(sub), draw(st.lists(sub, max_size=2)))
    if choice == 2:
        return ast.Index(draw(sub), draw(st.lists(sub, min_size=1, max_size=2)))
    if choice == 3:
        return ast.Paren(draw(sub))
    return ast.Binary(draw(st.sampled_from(gen.BINOPS)), draw(sub), draw(sub))


_raw_stmts = st.one_of(
    st.builds(ast.ExprStmt, _raw_exprs()),
    st.builds(ast.Assign, _raw_exprs(), st.just("="), _raw_exprs()),
    st.builds(ast.Let, gen.names, st.none(), _raw_exprs()),
    st.builds(ast.Var, gen.names, st.none() | st.sampled_from([ast.ScalarTypeRef("f32"), ast.DynTypeRef("int"),
                                                               ast.TensorTypeRef("f32", [ast.IntLit(1, "1")])]),
              st.none() | _raw_exprs()),
    st.builds(ast.Return, st.none() | _raw_exprs()),
    st.builds(ast.Expect, _raw_exprs()),
    st.just(ast.Break()),
    st.builds(ast.While, _raw_exprs(), st.just(ast.Block([]))),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_raw_stmts, max_size=3))
def test_reader_accepts_exactly_the_trees_that_reparse(stmts: list[ast.Stmt]) -> None:
    items = [ast.Fn("f", [], None, ast.Block(stmts))]
    try:
        read_module(encode_items(items), "<raw>")
        accepted = True
    except LoomBytecodeError:
        accepted = False
    try:
        reparses = parse_module(format_module(ast.Module("<raw>", items))).items == items
    except LoomSyntaxError:
        reparses = False
    assert accepted == reparses, format_module(ast.Module("<raw>", items))

"""The canonical `.loom` formatter: `ast.Module` → text, so every file has one layout (`loomc fmt`).

Style decisions (the formatter is the style guide):

* 4-space indentation, one statement per line, `{` on the header line, `}` on its own
  line, `} else {` / `} else if c {` joined. No line wrapping: an expression is
  always printed on one line, however long.
* A block with no statements and no comments inside prints as `{}` (also inside an
  if/else chain: `if c {} else {`); an empty import list prints `use "p" {}`; an
  empty module prints as the empty string.
* Expressions are printed exactly as the AST encodes them: binary operators with one
  space either side, unary operators attached, `Paren` nodes kept, never added. The
  parser only nests a looser operator under a tighter one through a `Paren`, so this
  is faithful. Literals print their source `text` (hex, float spellings, escapes).
  Ranges print `a..b` without spaces.
* Blank lines: at most one, kept between two elements (items, statements, own-line
  comments) only where the source had one; never at the start/end of a block or file.
* Comments: an own-line comment prints before the next element, at that block's
  indentation (before the `}` when nothing follows in the block). A trailing comment
  stays trailing (`stmt  // c`) only after a simple statement or block-less item that
  ends on its line; anywhere else (after `{`, after `}`, inside a multi-line
  expression) it becomes an own-line comment before the next element (comments
  inside a simple statement print right after it). Every comment prints once, in order.

Generated ASTs (no `source`, no comments) print without blank lines. Every AST that
comes from `parse_module` round-trips; the parser's same-line rule (a call's `(`, an
index's `[` and a returned value start on the line where their operand ends) is what
keeps one-statement-per-line output unambiguous.
"""

from __future__ import annotations

from typing import Sequence, Union

from loomc.syntax import ast
from loomc.syntax.parse import parse_module

INDENT = "    "
Pos = tuple[int, int]
_END: Pos = (1 << 62, 0)
Element = Union[ast.Item, ast.Stmt]


# ---- expressions and types ------------------------------------------------------------------


def format_expr(e: ast.Expr) -> str:
    """One expression on one line; relies on `Paren` nodes for grouping (adds none)."""
    if isinstance(e, (ast.IntLit, ast.FloatLit, ast.StrLit, ast.BytesLit)):
        return e.text
    if isinstance(e, ast.BoolLit):
        return "true" if e.value else "false"
    if isinstance(e, ast.NullLit):
        return "null"
    if isinstance(e, (ast.Name, ast.TypeName)):
        return e.name
    if isinstance(e, ast.Binary):
        return f"{format_expr(e.left)} {e.op} {format_expr(e.right)}"
    if isinstance(e, ast.Unary):
        return f"{e.op}{format_expr(e.operand)}"
    if isinstance(e, ast.Call):
        return f"{format_expr(e.callee)}({_exprs(e.args)})"
    if isinstance(e, ast.Index):
        return f"{format_expr(e.base)}[{_exprs(e.indices)}]"
    if isinstance(e, ast.ListLit):
        return f"[{_exprs(e.items)}]"
    if isinstance(e, ast.MapLit):
        return "{" + ", ".join(f"{format_expr(k)}: {format_expr(v)}" for k, v in e.items) + "}"
    if isinstance(e, ast.Bitcast):
        return f"bitcast[{e.dtype}]({format_expr(e.operand)})"
    if isinstance(e, ast.Paren):
        return f"({format_expr(e.inner)})"
    raise TypeError(f"not an expression: {e!r}")


def _exprs(items: Sequence[ast.Expr]) -> str:
    return ", ".join(format_expr(x) for x in items)


def format_type(t: ast.TypeRef) -> str:
    if isinstance(t, ast.TensorTypeRef):
        return f"{t.dtype}[{_exprs(t.dims)}]"
    return t.name


def _args(args: Sequence[ast.ArgDecl]) -> str:
    return ", ".join(f"{a.mode + ' ' if a.mode else ''}{a.name}: {format_type(a.type)}" for a in args)


def _typed(name: str, type_: ast.TypeRef | None) -> str:
    return name if type_ is None else f"{name}: {format_type(type_)}"


# ---- layout ---------------------------------------------------------------------------------------


def _start(span: ast.Span) -> Pos:
    return (span.line, span.column)


def _pos(c: ast.Comment) -> Pos:
    return (c.line, c.column)


class _Printer:
    """Walks items/statements in source order, interleaving comments by source position."""

    def __init__(self, module: ast.Module):
        self.comments = sorted(module.comments, key=_pos)
        self.ci = 0
        self.src = module.source.split("\n") if module.source else []
        self.out: list[str] = []
        self.last_line = 0  # last source line already accounted for
        self.first = True  # next element opens a block (or the file): no blank line before it

    # -- comments and blank lines --

    def _peek(self) -> ast.Comment | None:
        return self.comments[self.ci] if self.ci < len(self.comments) else None

    def _separate(self, line: int) -> None:
        """Emit one blank line if the source had a blank line between the previous element and `line`."""
        if not self.first and any(not self.src[i].strip() for i in range(self.last_line, min(line - 1, len(self.src)))):
            self.out.append("")
        self.first = False

    def _comments_before(self, pos: Pos, indent: str) -> None:
        while (c := self._peek()) is not None and _pos(c) < pos:
            self._separate(c.line)
            self.out.append(indent + c.text.rstrip())
            self.last_line = max(self.last_line, c.line)
            self.ci += 1

    # -- elements --

    def elements(self, elems: Sequence[Element], indent: str, end: Pos) -> None:
        """Print a sequence of items or statements; comments before `end` stay inside."""
        for i, el in enumerate(elems):
            nxt = _start(elems[i + 1].span) if i + 1 < len(elems) else end
            self._comments_before(_start(el.span), indent)
            self._separate(el.span.line)
            if isinstance(el, (ast.Use, ast.Config, ast.Param, ast.State, ast.Stage, ast.Let, ast.Var,
                               ast.Assign, ast.ExprStmt, ast.Return, ast.Break, ast.Continue, ast.Expect)):
                self._simple(_simple_text(el), el.span, indent, nxt)
            else:
                self._compound(el, indent)
        self._comments_before(end, indent)

    def _simple(self, text: str, span: ast.Span, indent: str, nxt: Pos) -> None:
        """A one-line element; a comment trailing its last source line stays trailing."""
        inner: list[ast.Comment] = []
        while (c := self._peek()) is not None and _pos(c) < (span.end_line, span.end_column):
            inner.append(c)
            self.ci += 1
        line = indent + text
        c = self._peek()
        if not inner and c is not None and c.trailing and c.line == span.end_line and _pos(c) < nxt:
            line += "  " + c.text.rstrip()
            self.ci += 1
        self.out.append(line)
        self.out.extend(indent + c.text.rstrip() for c in inner)
        self.last_line = max(self.last_line, span.end_line)

    def _block(self, header: str, block: ast.Block, indent: str) -> None:
        """`header {` … `}`; `header` already carries its indentation (or a joined `} else`)."""
        end = (block.span.end_line, block.span.end_column - 1)  # the closing brace
        c = self._peek()
        if not block.stmts and (c is None or _pos(c) >= end):
            self.out.append(header + " {}")
        else:
            self.out.append(header + " {")
            self.first = True
            self.elements(block.stmts, indent + INDENT, end)
            self.out.append(indent + "}")
        self.first = False
        self.last_line = max(self.last_line, block.span.end_line)

    def _compound(self, el: Element, indent: str) -> None:
        if isinstance(el, ast.If):
            self._if(el, indent, indent + "if")
        elif isinstance(el, ast.For):
            rng = format_expr(el.start) + ("" if el.end is None else ".." + format_expr(el.end))
            self._block(f"{indent}for {el.var} in {rng}", el.body, indent)
        elif isinstance(el, ast.ParallelFor):
            binds = ", ".join(f"{b.var} in {format_expr(b.start)}..{format_expr(b.end)}" for b in el.binds)
            self._block(f"{indent}parallel for {binds}", el.body, indent)
        elif isinstance(el, ast.While):
            self._block(f"{indent}while {format_expr(el.cond)}", el.body, indent)
        elif isinstance(el, ast.Kernel):
            self._block(f"kernel {el.name}({_args(el.args)})", el.body, indent)
        elif isinstance(el, ast.Command):
            self._block(f"command {el.name}({_args(el.args)}){_results(el.results)}", el.body, indent)
        elif isinstance(el, ast.Fn):
            ret = "" if el.ret is None else " -> " + format_type(el.ret)
            self._block(f"fn {el.name}({_args(el.args)}){ret}", el.body, indent)
        elif isinstance(el, ast.Check):
            self._block(f"check {el.name}", el.body, indent)
        else:
            raise TypeError(f"not an item or statement: {el!r}")

    def _if(self, node: ast.If, indent: str, head: str) -> None:
        """An if/else chain; each `else` joins the previous block's closing line."""
        self._block(f"{head} {format_expr(node.cond)}", node.then, indent)
        if isinstance(node.orelse, ast.If):
            self._if(node.orelse, indent, self.out.pop() + " else if")
        elif isinstance(node.orelse, ast.Block):
            self._block(self.out.pop() + " else", node.orelse, indent)


def _results(results: list[ast.ArgDecl] | None) -> str:
    return "" if results is None else f" -> ({_args(results)})"


def _simple_text(el: Element) -> str:
    """The one-line text of a block-less item or simple statement."""
    if isinstance(el, ast.Use):
        names = ", ".join(i.name if i.alias is None else f"{i.name} as {i.alias}" for i in el.imports)
        return f"use {el.path_text} {{ {names} }}" if names else f"use {el.path_text} {{}}"
    if isinstance(el, ast.Config):
        return f"config {el.name}: {format_type(el.type)} = {format_expr(el.value)}"
    if isinstance(el, ast.Param):
        fam = "" if el.family is None else (
            f"[{el.family.var} in {format_expr(el.family.start)}..{format_expr(el.family.end)}]")
        return f"param {el.name}{fam}: {format_type(el.type)} = {format_expr(el.value)}"
    if isinstance(el, ast.State):
        return f"state {el.name}: {format_type(el.type)} per {el.scope}"
    if isinstance(el, ast.Stage):
        return f"stage {el.name}({_args(el.args)}){_results(el.results)}"
    if isinstance(el, ast.Let):
        return f"let {_typed(el.name, el.type)} = {format_expr(el.value)}"
    if isinstance(el, ast.Var):
        return f"var {_typed(el.name, el.type)}" + ("" if el.value is None else f" = {format_expr(el.value)}")
    if isinstance(el, ast.Assign):
        return f"{format_expr(el.target)} {el.op} {format_expr(el.value)}"
    if isinstance(el, ast.ExprStmt):
        return format_expr(el.expr)
    if isinstance(el, ast.Return):
        return "return" if el.value is None else f"return {format_expr(el.value)}"
    if isinstance(el, ast.Break):
        return "break"
    if isinstance(el, ast.Continue):
        return "continue"
    if isinstance(el, ast.Expect):
        return f"expect {format_expr(el.cond)}"
    raise TypeError(f"not a simple element: {el!r}")


# ---- entry points ---------------------------------------------------------------------------------


def format_module(module: ast.Module) -> str:
    """Canonical text for a module, comments included; ends with exactly one newline."""
    p = _Printer(module)
    p.elements(module.items, "", _END)
    return "\n".join(p.out) + "\n" if p.out else ""


def format_source(text: str, path: str = "<input>") -> str:
    """Parse then print; raises `LoomSyntaxError` on bad input."""
    return format_module(parse_module(text, path))

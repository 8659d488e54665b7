"""Lark tree → typed AST. Pure construction: names, types and shapes are checked in `loomc.check`.

Problems the grammar cannot express (a bad escape, a mode word other than
`out`/`inout`, an integer wider than 64 bits) are collected as diagnostics
instead of raised, so nothing inside a lark callback ever throws.
"""

from __future__ import annotations

import re

from lark import Token, Tree

from loomc.syntax import ast
from loomc.syntax.diagnostics import Diagnostic

ARG_MODES = ("out", "inout")
# Deepest nesting of expressions and blocks: every later pass (checker, printer, lowering)
# recurses over the tree, so the limit is what keeps them all inside Python's stack.
MAX_NESTING = 200


class TooDeep(Exception):
    """Raised out of the builder (never out of `parse_module`) at the first node past MAX_NESTING."""

    def __init__(self, span: ast.Span):
        self.span = span
_ESCAPE = re.compile(r"\\(u\{([0-9a-fA-F]{1,6})\}|x([0-9a-fA-F]{2})|.)")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}


def span_of(node: Tree | Token) -> ast.Span:
    if isinstance(node, Token):
        return ast.Span(node.line, node.column, node.end_line, node.end_column)
    meta = node.meta
    if getattr(meta, "empty", True):
        return ast.NO_SPAN
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column)


class AstBuilder:
    def __init__(self, path: str, text: str = ""):
        self.path = path
        self.lines = text.split("\n")
        self.diagnostics: list[Diagnostic] = []
        self.depth = 0

    def error(self, span: ast.Span, code: str, message: str) -> None:
        self.diagnostics.append(
            Diagnostic(self.path, span.line, span.column, code, message,
                       end_line=span.end_line, end_column=span.end_column)
        )

    def same_line(self, before: ast.Span, after: ast.Span, what: str) -> None:
        """Newlines end statements only by convention, so a line that starts with '(' or '['
        would silently continue the previous line. Require the opener on the line where its
        operand ends (as Go does); a line starting with '(' or '[' is then rejected, not merged."""
        if before.end_line and after.line and after.line != before.end_line:
            self.error(after, "L0107", f"{what} must be on the line where its operand ends "
                                       f"(line {before.end_line})")

    def opener_after(self, before: ast.Span) -> ast.Span:
        """The position of the first non-blank character after `before` (the '(' or '[')."""
        line, col = before.end_line, before.end_column
        while 1 <= line <= len(self.lines):
            text = self.lines[line - 1]
            while col <= len(text) and text[col - 1] in " \t\r":
                col += 1
            if col <= len(text):
                return ast.Span(line, col, line, col + 1)
            line, col = line + 1, 1
        return ast.NO_SPAN

    # ---- items ------------------------------------------------------------------

    def module(self, tree: Tree) -> list[ast.Item]:
        return [self.item(child) for child in tree.children]

    def item(self, t: Tree) -> ast.Item:
        return getattr(self, "item_" + t.data)(t)

    def item_use_decl(self, t: Tree) -> ast.Use:
        path_tok, *rest = t.children
        imports = [self.import_item(c) for c in rest if isinstance(c, Tree)]
        return ast.Use(self.string_value(path_tok), str(path_tok), imports, span_of(t), span_of(path_tok))

    def import_item(self, t: Tree) -> ast.ImportItem:
        name, alias = t.children
        return ast.ImportItem(str(name), str(alias) if alias is not None else None, span_of(t))

    def item_config_decl(self, t: Tree) -> ast.Config:
        name, type_, value = t.children
        return ast.Config(str(name), self.type_ref(type_), self.expr(value), span_of(t), span_of(name))

    def item_param_decl(self, t: Tree) -> ast.Param:
        name, family, type_, value = t.children
        fam = None
        if family is not None:
            var, start, end = family.children
            fam = ast.Family(str(var), self.expr(start), self.expr(end), span_of(family))
        return ast.Param(str(name), fam, self.type_ref(type_), self.expr(value), span_of(t), span_of(name))

    def item_state_decl(self, t: Tree) -> ast.State:
        name, type_, scope = t.children
        return ast.State(str(name), self.type_ref(type_), str(scope), span_of(t), span_of(name), span_of(scope))

    def item_kernel_decl(self, t: Tree) -> ast.Kernel:
        name, args, body = t.children
        return ast.Kernel(str(name), self.arg_decls(args), self.block(body), span_of(t), span_of(name))

    def item_command_decl(self, t: Tree) -> ast.Command:
        name, args, results, body = t.children
        return ast.Command(str(name), self.arg_decls(args), self.results(results), self.block(body),
                           span_of(t), span_of(name))

    def item_stage_decl(self, t: Tree) -> ast.Stage:
        name, args, results = t.children
        return ast.Stage(str(name), self.arg_decls(args), self.results(results), span_of(t), span_of(name))

    def item_fn_decl(self, t: Tree) -> ast.Fn:
        name, args, ret, body = t.children
        return ast.Fn(str(name), self.arg_decls(args), self.type_ref(ret) if ret is not None else None,
                      self.block(body), span_of(t), span_of(name))

    def item_check_decl(self, t: Tree) -> ast.Check:
        name, body = t.children
        return ast.Check(str(name), self.block(body), span_of(t), span_of(name))

    def results(self, t: Tree | None) -> list[ast.ArgDecl] | None:
        if t is None:
            return None
        return self.arg_decls(t.children[0])

    def arg_decls(self, t: Tree | None) -> list[ast.ArgDecl]:
        if t is None:
            return []
        return [self.arg_decl(c) for c in t.children if isinstance(c, Tree)]

    def arg_decl(self, t: Tree) -> ast.ArgDecl:
        mode, name, type_ = t.children
        if mode is not None and str(mode) not in ARG_MODES:
            self.error(span_of(mode), "L0105",
                       f"unknown argument mode '{mode}': expected 'out' or 'inout' before the name")
        return ast.ArgDecl(str(mode) if mode is not None else None, str(name), self.type_ref(type_), span_of(t))

    # ---- types --------------------------------------------------------------------

    def type_ref(self, t: Tree) -> ast.TypeRef:
        if t.data == "scalar_type":
            return ast.ScalarTypeRef(self.keyword(t.children[0]), span_of(t))
        if t.data == "tensor_type":
            dtype, *dims = t.children
            self.same_line(span_of(dtype), self.opener_after(span_of(dtype)), "a tensor type's '['")
            return ast.TensorTypeRef(self.keyword(dtype), [self.expr(d) for d in dims if d is not None], span_of(t))
        return ast.DynTypeRef(self.keyword(t.children[0]), span_of(t))

    @staticmethod
    def keyword(t: Tree) -> str:
        return str(t.children[0])

    # ---- statements --------------------------------------------------------------------

    def block(self, t: Tree) -> ast.Block:
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise TooDeep(span_of(t))
            return ast.Block([self.stmt(c) for c in t.children], span_of(t))
        finally:
            self.depth -= 1

    def stmt(self, t: Tree) -> ast.Stmt:
        return getattr(self, "stmt_" + t.data)(t)

    def stmt_let_stmt(self, t: Tree) -> ast.Let:
        name, type_, value = t.children
        return ast.Let(str(name), self.type_ref(type_) if type_ is not None else None, self.expr(value),
                       span_of(t), span_of(name))

    def stmt_var_stmt(self, t: Tree) -> ast.Var:
        name, type_, value = t.children
        return ast.Var(str(name), self.type_ref(type_) if type_ is not None else None,
                       self.expr(value) if value is not None else None, span_of(t), span_of(name))

    def stmt_assign_stmt(self, t: Tree) -> ast.Assign:
        target, op, value = t.children
        return ast.Assign(self.expr(target), str(op.children[0]), self.expr(value), span_of(t))

    def stmt_expr_stmt(self, t: Tree) -> ast.ExprStmt:
        return ast.ExprStmt(self.expr(t.children[0]), span_of(t))

    def stmt_if_stmt(self, t: Tree) -> ast.If:
        cond, then, orelse = t.children
        other: ast.Block | ast.If | None = None
        if orelse is not None:
            other = self.block(orelse) if orelse.data == "block" else self.stmt_if_stmt(orelse)
        return ast.If(self.expr(cond), self.block(then), other, span_of(t))

    def stmt_for_stmt(self, t: Tree) -> ast.For:
        var, start, end, body = t.children
        return ast.For(str(var), self.expr(start), self.expr(end) if end is not None else None, self.block(body),
                       span_of(t), span_of(var))

    def stmt_parallel_for_stmt(self, t: Tree) -> ast.ParallelFor:
        *binds, body = t.children
        out = []
        for b in binds:
            var, start, end = b.children
            out.append(ast.RangeBind(str(var), self.expr(start), self.expr(end), span_of(b)))
        return ast.ParallelFor(out, self.block(body), span_of(t))

    def stmt_while_stmt(self, t: Tree) -> ast.While:
        cond, body = t.children
        return ast.While(self.expr(cond), self.block(body), span_of(t))

    def stmt_return_stmt(self, t: Tree) -> ast.Return:
        (value,) = t.children
        if value is not None and span_of(value).line != span_of(t).line:
            self.error(span_of(value), "L0108", f"a returned value must start on the line of its `return` "
                                                f"(line {span_of(t).line}); a bare `return` ends the line")
        return ast.Return(self.expr(value) if value is not None else None, span_of(t))

    def stmt_break_stmt(self, t: Tree) -> ast.Break:
        return ast.Break(span_of(t))

    def stmt_continue_stmt(self, t: Tree) -> ast.Continue:
        return ast.Continue(span_of(t))

    def stmt_expect_stmt(self, t: Tree) -> ast.Expect:
        return ast.Expect(self.expr(t.children[0]), span_of(t))

    # ---- expressions ----------------------------------------------------------------------

    def expr(self, t: Tree) -> ast.Expr:
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise TooDeep(span_of(t))
            return getattr(self, "expr_" + t.data)(t)
        finally:
            self.depth -= 1

    def expr_binary(self, t: Tree) -> ast.Binary:
        left, op, right = t.children
        op_tok = op if isinstance(op, Token) else op.children[0]
        return ast.Binary(str(op_tok), self.expr(left), self.expr(right), span_of(t), span_of(op_tok))

    def expr_unary(self, t: Tree) -> ast.Unary:
        op, operand = t.children
        return ast.Unary(str(op.children[0]), self.expr(operand), span_of(t))

    def expr_call(self, t: Tree) -> ast.Call:
        callee, args = t.children
        self.same_line(span_of(callee), self.opener_after(span_of(callee)), "a call's '('")
        return ast.Call(self.expr(callee), self.args(args), span_of(t))

    def expr_index(self, t: Tree) -> ast.Index:
        base, args = t.children
        self.same_line(span_of(base), self.opener_after(span_of(base)), "an index's '['")
        return ast.Index(self.expr(base), self.args(args), span_of(t))

    def args(self, t: Tree | None) -> list[ast.Expr]:
        if t is None:
            return []
        return [self.expr(c) for c in t.children if c is not None]

    def expr_int_lit(self, t: Tree) -> ast.IntLit:
        tok = t.children[0]
        text = str(tok)
        base = {"0x": 16, "0b": 2}.get(text[:2], 10)
        digits = text.replace("_", "")[2 if base != 10 else 0:].lstrip("0") or "0"
        if len(digits) > 70:  # longer than any 64-bit value in any base (and int() refuses past 4300 digits)
            self.error(span_of(tok), "L0106", f"integer literal {text[:24]}... does not fit in 64 bits")
            return ast.IntLit(0, text, span_of(t))
        value = int(digits, base)
        if value >= 2**64:
            self.error(span_of(tok), "L0106", f"integer literal {text} does not fit in 64 bits")
        return ast.IntLit(value, text, span_of(t))

    def expr_float_lit(self, t: Tree) -> ast.FloatLit:
        text = str(t.children[0])
        return ast.FloatLit(float(text.replace("_", "")), text, span_of(t))

    def expr_str_lit(self, t: Tree) -> ast.StrLit:
        tok = t.children[0]
        return ast.StrLit(self.string_value(tok), str(tok), span_of(t))

    def expr_bytes_lit(self, t: Tree) -> ast.BytesLit:
        tok = t.children[0]
        value = self.unescape(str(tok)[2:-1], tok, allow_unicode=False)
        wide = next((i for i, ch in enumerate(str(tok)) if ord(ch) > 0x7F), None)
        if wide is not None:
            self.diagnostics.append(Diagnostic(self.path, tok.line, tok.column + wide, "L0104",
                                               "a bytes literal holds ASCII characters; write other bytes as \\xHH"))
            return ast.BytesLit(b"", str(tok), span_of(t))
        return ast.BytesLit(value.encode("latin-1"), str(tok), span_of(t))

    def expr_true_lit(self, t: Tree) -> ast.BoolLit:
        return ast.BoolLit(True, span_of(t))

    def expr_false_lit(self, t: Tree) -> ast.BoolLit:
        return ast.BoolLit(False, span_of(t))

    def expr_null_lit(self, t: Tree) -> ast.NullLit:
        return ast.NullLit(span_of(t))

    def expr_name(self, t: Tree) -> ast.Name:
        return ast.Name(str(t.children[0]), span_of(t))

    def expr_type_name(self, t: Tree) -> ast.TypeName:
        return ast.TypeName(self.keyword(t.children[0]), span_of(t))

    def expr_paren(self, t: Tree) -> ast.Paren:
        return ast.Paren(self.expr(t.children[0]), span_of(t))

    def expr_list_lit(self, t: Tree) -> ast.ListLit:
        return ast.ListLit(self.args(t.children[0]), span_of(t))

    def expr_map_lit(self, t: Tree) -> ast.MapLit:
        items = []
        for c in t.children:
            if c is not None:
                k, v = c.children
                items.append((self.expr(k), self.expr(v)))
        return ast.MapLit(items, span_of(t))

    def expr_bitcast(self, t: Tree) -> ast.Bitcast:
        dtype, operand = t.children
        return ast.Bitcast(self.keyword(dtype), self.expr(operand), span_of(t))

    # ---- literals ---------------------------------------------------------------------------

    def string_value(self, tok: Token) -> str:
        return self.unescape(str(tok)[1:-1], tok, allow_unicode=True)

    def unescape(self, body: str, tok: Token, allow_unicode: bool) -> str:
        def replace(m: re.Match) -> str:
            whole, uni, hexa = m.group(1), m.group(2), m.group(3)
            if uni is not None and allow_unicode:
                code = int(uni, 16)
                if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
                    return chr(code)
            elif hexa is not None:
                return chr(int(hexa, 16))
            elif whole in _SIMPLE_ESCAPES:
                return _SIMPLE_ESCAPES[whole]
            offset = m.start() + (2 if str(tok).startswith("b") else 1)
            self.diagnostics.append(Diagnostic(
                self.path, tok.line, tok.column + offset, "L0104",
                f"invalid escape sequence '\\{whole}' in string literal",
                notes=("valid escapes: \\n \\t \\r \\0 \\\\ \\\" \\' \\xHH and (in strings) \\u{HHHHHH}",),
            ))
            return ""

        return _ESCAPE.sub(replace, body)

"""The shape rules an AST must follow for its canonical text to parse back to the same AST.

The parser only ever builds trees that follow them; a crafted `.loombc` could describe
one that does not (a `+` under a `*` with no `Paren`, two statements that would merge
on reparse), and `dis` would then print text meaning something else. The reader checks
each node against these rules as it builds it, so every file it accepts is one that
`dis` → `build` reproduces.

The printer prints every expression on one line and adds no parentheses, and newlines
are not tokens, so the rules are:

* operands: a child binds at least as tightly as its position needs (the grammar's
  precedence levels; comparisons do not chain);
* statements: within a block, a statement that starts with `(`, `[` or `-` cannot
  follow one that ends with an expression (the parser would read a call, an index or
  a subtraction), nor can `[` follow `var x: f32` (a tensor type), and nothing that
  starts with an expression can follow a bare `return` (it would become the value).
"""

from __future__ import annotations

from typing import Sequence

from loomc.syntax import ast

# Binary precedence levels, loosest first; must agree with loomc/grammar/loom.lark.
LEVELS = (("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">="), ("|",), ("^",), ("&",), ("<<", ">>"),
          ("+", "-"), ("*", "/", "%"))
LEVEL = {op: i for i, ops in enumerate(LEVELS) for op in ops}
COMPARISON = LEVEL["=="]
UNARY = len(LEVELS)
POSTFIX = UNARY + 1
ATOM = POSTFIX + 1


def precedence(e: ast.Expr) -> int:
    if isinstance(e, ast.Binary):
        return LEVEL[e.op]
    if isinstance(e, ast.Unary):
        return UNARY
    if isinstance(e, (ast.Call, ast.Index)):
        return POSTFIX
    return ATOM


def operand_problem(node: ast.Expr) -> str | None:
    """Why a child of `node` would not reparse as that child (it needs a `Paren`), or None."""
    if isinstance(node, ast.Binary):
        level = LEVEL[node.op]
        if precedence(node.left) < (level + 1 if level == COMPARISON else level):
            return f"the left operand of '{node.op}' needs parentheses"
        if precedence(node.right) <= level:
            return f"the right operand of '{node.op}' needs parentheses"
    elif isinstance(node, ast.Unary) and precedence(node.operand) < UNARY:
        return f"the operand of unary '{node.op}' needs parentheses"
    elif isinstance(node, ast.Call) and precedence(node.callee) < POSTFIX:
        return "a callee needs parentheses"
    elif isinstance(node, ast.Index) and precedence(node.base) < POSTFIX:
        return "an indexed value needs parentheses"
    return None


def first_token(e: ast.Expr) -> str:
    """The first token of `e` as printed, for the punctuation that matters ('(', '[', '-'); 'x' otherwise."""
    while True:
        if isinstance(e, ast.Binary):
            e = e.left
        elif isinstance(e, ast.Call):
            e = e.callee
        elif isinstance(e, ast.Index):
            e = e.base
        elif isinstance(e, ast.Unary):
            return e.op
        elif isinstance(e, ast.Paren):
            return "("
        elif isinstance(e, ast.ListLit):
            return "["
        else:
            return "x"


def _leading_expr(s: ast.Stmt) -> ast.Expr | None:
    if isinstance(s, ast.Assign):
        return s.target
    if isinstance(s, ast.ExprStmt):
        return s.expr
    return None


def _ends_with_expr(s: ast.Stmt) -> bool:
    if isinstance(s, (ast.Let, ast.Assign, ast.ExprStmt, ast.Expect)):
        return True
    return isinstance(s, (ast.Return, ast.Var)) and s.value is not None


def block_problem(stmts: Sequence[ast.Stmt]) -> str | None:
    """Why two neighbouring statements would merge when printed one per line, or None."""
    for i in range(1, len(stmts)):
        prev, lead = stmts[i - 1], _leading_expr(stmts[i])
        if lead is None:
            continue
        if isinstance(prev, ast.Return) and prev.value is None:
            return f"statement {i + 1} would become the value of the bare `return` before it"
        tok = first_token(lead)
        if tok in ("(", "[", "-") and _ends_with_expr(prev):
            return f"statement {i + 1} starts with '{tok}' and would continue the expression before it"
        if tok == "[" and isinstance(prev, ast.Var) and prev.value is None \
                and isinstance(prev.type, ast.ScalarTypeRef):
            return f"statement {i + 1} starts with '[' and would make the type before it a tensor type"
    return None

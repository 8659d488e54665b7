"""The typed `.loom` AST. Built from lark's tree by `build.py`; consumed by the checker and printer.

Every node carries a `span`; spans are excluded from equality so that two parses
of the same program in different layouts compare equal (the formatter's
meaning-preservation test relies on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class Span:
    line: int
    column: int
    end_line: int
    end_column: int


NO_SPAN = Span(0, 0, 0, 0)


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


# ---- types -------------------------------------------------------------------------------


@dataclass
class ScalarTypeRef:
    """A numeric scalar type: bool, i8..u64, f16/bf16/f32/f64, or a block-quantized storage type."""

    name: str
    span: Span = _span()


@dataclass
class TensorTypeRef:
    dtype: str
    dims: list["Expr"]
    span: Span = _span()


@dataclass
class DynTypeRef:
    """A dynamic control type: any, int, float, str, bytes, list, map (`bool` parses as a ScalarTypeRef)."""

    name: str
    span: Span = _span()


TypeRef = Union[ScalarTypeRef, TensorTypeRef, DynTypeRef]


# ---- expressions ------------------------------------------------------------------------


@dataclass
class IntLit:
    value: int
    text: str
    span: Span = _span()


@dataclass
class FloatLit:
    value: float
    text: str
    span: Span = _span()


@dataclass
class StrLit:
    value: str
    text: str
    span: Span = _span()


@dataclass
class BytesLit:
    value: bytes
    text: str
    span: Span = _span()


@dataclass
class BoolLit:
    value: bool
    span: Span = _span()


@dataclass
class NullLit:
    span: Span = _span()


@dataclass
class Name:
    name: str
    span: Span = _span()


@dataclass
class TypeName:
    """A type keyword in expression position; only meaningful as a conversion callee (`f32(x)`)."""

    name: str
    span: Span = _span()


@dataclass
class Binary:
    op: str
    left: "Expr"
    right: "Expr"
    span: Span = _span()
    op_span: Span = _span()


@dataclass
class Unary:
    op: str
    operand: "Expr"
    span: Span = _span()


@dataclass
class Call:
    callee: "Expr"
    args: list["Expr"]
    span: Span = _span()


@dataclass
class Index:
    base: "Expr"
    indices: list["Expr"]
    span: Span = _span()


@dataclass
class ListLit:
    items: list["Expr"]
    span: Span = _span()


@dataclass
class MapLit:
    items: list[tuple["Expr", "Expr"]]
    span: Span = _span()


@dataclass
class Bitcast:
    dtype: str
    operand: "Expr"
    span: Span = _span()


@dataclass
class Paren:
    inner: "Expr"
    span: Span = _span()


Expr = Union[
    IntLit, FloatLit, StrLit, BytesLit, BoolLit, NullLit, Name, TypeName,
    Binary, Unary, Call, Index, ListLit, MapLit, Bitcast, Paren,
]


# ---- statements -------------------------------------------------------------------------


@dataclass
class Block:
    stmts: list["Stmt"]
    span: Span = _span()


@dataclass
class Let:
    name: str
    type: TypeRef | None
    value: Expr
    span: Span = _span()
    name_span: Span = _span()


@dataclass
class Var:
    name: str
    type: TypeRef | None
    value: Expr | None
    span: Span = _span()
    name_span: Span = _span()


@dataclass
class Assign:
    target: Expr
    op: str
    value: Expr
    span: Span = _span()


@dataclass
class ExprStmt:
    expr: Expr
    span: Span = _span()


@dataclass
class If:
    cond: Expr
    then: Block
    orelse: "Block | If | None"
    span: Span = _span()


@dataclass
class For:
    """`for x in items { }` (end is None) or the sequential range `for i in a..b { }`."""

    var: str
    start: Expr
    end: Expr | None
    body: Block
    span: Span = _span()
    var_span: Span = _span()


@dataclass
class RangeBind:
    var: str
    start: Expr
    end: Expr
    span: Span = _span()


@dataclass
class ParallelFor:
    binds: list[RangeBind]
    body: Block
    span: Span = _span()


@dataclass
class While:
    cond: Expr
    body: Block
    span: Span = _span()


@dataclass
class Return:
    value: Expr | None
    span: Span = _span()


@dataclass
class Break:
    span: Span = _span()


@dataclass
class Continue:
    span: Span = _span()


@dataclass
class Expect:
    cond: Expr
    span: Span = _span()


Stmt = Union[Let, Var, Assign, ExprStmt, If, For, ParallelFor, While, Return, Break, Continue, Expect]


# ---- items --------------------------------------------------------------------------------


@dataclass
class ImportItem:
    name: str
    alias: str | None
    span: Span = _span()

    @property
    def local_name(self) -> str:
        return self.alias or self.name


@dataclass
class Use:
    path: str
    path_text: str
    imports: list[ImportItem]
    span: Span = _span()
    path_span: Span = _span()


@dataclass
class Config:
    name: str
    type: TypeRef
    value: Expr
    span: Span = _span()
    name_span: Span = _span()


@dataclass
class Family:
    var: str
    start: Expr
    end: Expr
    span: Span = _span()


@dataclass
class Param:
    name: str
    family: Family | None
    type: TypeRef
    value: Expr
    span: Span = _span()
    name_span: Span = _span()


@dataclass
class State:
    name: str
    type: TypeRef
    scope: str
    span: Span = _span()
    name_span: Span = _span()
    scope_span: Span = _span()


@dataclass
class ArgDecl:
    mode: str | None  # None (read), "out" or "inout"
    name: str
    type: TypeRef
    span: Span = _span()


@dataclass
class Kernel:
    name: str
    args: list[ArgDecl]
    body: Block
    span: Span = _span()
    name_span: Span = _span()


@dataclass
class Command:
    name: str
    args: list[ArgDecl]
    results: list[ArgDecl] | None
    body: Block
    span: Span = _span()
    name_span: Span = _span()


@dataclass
class Stage:
    name: str
    args: list[ArgDecl]
    results: list[ArgDecl] | None
    span: Span = _span()
    name_span: Span = _span()


@dataclass
class Fn:
    name: str
    args: list[ArgDecl]
    ret: TypeRef | None
    body: Block
    span: Span = _span()
    name_span: Span = _span()


@dataclass
class Check:
    name: str
    body: Block
    span: Span = _span()
    name_span: Span = _span()


Item = Union[Use, Config, Param, State, Kernel, Command, Stage, Fn, Check]


@dataclass
class Comment:
    text: str
    line: int
    column: int
    trailing: bool  # code precedes it on the same line


@dataclass
class Module:
    path: str
    items: list[Item]
    comments: list[Comment] = field(default_factory=list, compare=False, repr=False)
    source: str = field(default="", compare=False, repr=False)

"""The node vocabulary of `.loombc`: one tag per `ast` class and the order and kind of its fields.

The writer and the reader are both interpreters of this one table, so a field added to
the AST is added here once and both sides follow. `tests/unit/loomc/bytecode` checks
that the table covers every node class of `loomc/syntax/ast.py` and all of its fields.

Tags and enum tables are append-only: a new entry gets a new number, and changing the
meaning of an existing one needs a new `FORMAT_VERSION`.

Field kinds and their encoding:

| kind       | bytes                                   | value                                 |
| ---------- | --------------------------------------- | ------------------------------------- |
| NAME       | string index                            | an identifier that is not a keyword   |
| OPT_NAME   | 0, or string index + 1                  | NAME or None                          |
| LITERAL    | constant index                          | sets two attributes: value and text   |
| BOOL       | 0 or 1                                  | bool                                  |
| ENUM       | index into the field's table            | str (or None for ARG_MODES[0])        |
| NODE       | a node whose tag is in the field's set  | node                                  |
| OPT_NODE   | tag 0 (NONE), or a node                 | node or None                          |
| NODES      | count, then that many nodes             | list (at least `min_count`)           |
| OPT_NODES  | 0, or count + 1 then the nodes          | list or None                          |
| PAIRS      | count, then key and value nodes         | list of (key, value)                  |
| TYPE       | types-section index                     | a fresh copy of that type template    |
| OPT_TYPE   | 0, or index + 1                         | type or None                          |

A node is its tag, then its fields in order. Its spans (every dataclass field typed
`Span`, in declaration order) are not in the node's bytes: they are the next entries
of the locations section, taken before the node's fields (pre-order).
Items are the exception: their tag and NAME live in the symbols section, and the code
section holds the rest of their fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum, auto

from loomc.bytecode.format import ConstKind
from loomc.syntax import ast


class Kind(Enum):
    NAME = auto()
    OPT_NAME = auto()
    LITERAL = auto()
    BOOL = auto()
    ENUM = auto()
    NODE = auto()
    OPT_NODE = auto()
    NODES = auto()
    OPT_NODES = auto()
    PAIRS = auto()
    TYPE = auto()
    OPT_TYPE = auto()


# ---- enum tables (append-only) ------------------------------------------------------------------

_FIRST_SCALAR_TYPES = ("bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
                       "f16", "bf16", "f32", "f64", "q4_0", "q4_1", "q8_0")
DYN_TYPES = ("any", "int", "float", "str", "bytes", "list", "map")
RETIRED = "retired "   # a table entry "retired NAME": a type this compiler no longer has; the reader refuses it


def live(table: tuple) -> tuple:
    """The entries of an enum table that name something (not retired)."""
    return tuple(name for name in table if not name.startswith(RETIRED))


# Appended to both tables below, so earlier codes keep their meaning; a retired type keeps its
# code (q4_1x4, 4-row panels, was retired for q4_1x16's 16-row panels).
_LATER_SCALAR_TYPES = (RETIRED + "q4_1x4", "q4_1x16", "q8_0x16")
SCALAR_TYPES = _FIRST_SCALAR_TYPES + _LATER_SCALAR_TYPES
TYPE_NAMES = _FIRST_SCALAR_TYPES + DYN_TYPES + _LATER_SCALAR_TYPES
BINARY_OPS = ("||", "&&", "==", "!=", "<", "<=", ">", ">=", "|", "^", "&", "<<", ">>", "+", "-", "*", "/", "%")
UNARY_OPS = ("-", "!", "~")
ASSIGN_OPS = ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=")
ARG_MODES = (None, "out", "inout")

# ---- tags ---------------------------------------------------------------------------------------------

NONE = 0  # an absent optional node

SCALAR_TYPE, TENSOR_TYPE, DYN_TYPE = 1, 2, 3
INT, FLOAT, STR, BYTES, BOOL, NULL, NAME, TYPE_NAME = 16, 17, 18, 19, 20, 21, 22, 23
BINARY, UNARY, CALL, INDEX, LIST, MAP, BITCAST, PAREN = 24, 25, 26, 27, 28, 29, 30, 31
LET, VAR, ASSIGN, EXPR_STMT, IF, FOR, PARALLEL_FOR, WHILE = 48, 49, 50, 51, 52, 53, 54, 55
RETURN, BREAK, CONTINUE, EXPECT = 56, 57, 58, 59
BLOCK, RANGE_BIND, ARG, FAMILY, IMPORT = 64, 65, 66, 67, 68
USE, CONFIG, PARAM, STATE, KERNEL, COMMAND, STAGE, FN, CHECK = 80, 81, 82, 83, 84, 85, 86, 87, 88

TYPE_TAGS = frozenset({SCALAR_TYPE, TENSOR_TYPE, DYN_TYPE})
EXPR_TAGS = frozenset(range(INT, PAREN + 1))
STMT_TAGS = frozenset(range(LET, EXPECT + 1))
ITEM_TAGS = frozenset(range(USE, CHECK + 1))


@dataclass(frozen=True)
class Field:
    attr: str  # for LITERAL: "value_attr,text_attr"
    kind: Kind
    tags: frozenset[int] = frozenset()  # NODE kinds: the tags allowed here
    table: tuple = ()  # ENUM: the values, by index
    const: ConstKind | None = None  # LITERAL: the constant kind required
    min_count: int = 0  # NODES: the fewest entries the grammar allows
    what: str = ""  # what the slot holds, for messages


@dataclass(frozen=True)
class NodeSpec:
    tag: int
    cls: type
    fields: tuple[Field, ...]
    spans: tuple[str, ...]  # attributes typed Span, in declaration order

    @property
    def name(self) -> str:
        return self.cls.__name__


def _name(attr: str = "name") -> Field:
    return Field(attr, Kind.NAME)


def _enum(attr: str, table: tuple) -> Field:
    return Field(attr, Kind.ENUM, table=table)


def _expr(attr: str) -> Field:
    return Field(attr, Kind.NODE, EXPR_TAGS, what="an expression")


def _opt_expr(attr: str) -> Field:
    return Field(attr, Kind.OPT_NODE, EXPR_TAGS, what="an expression")


def _exprs(attr: str, min_count: int = 0) -> Field:
    return Field(attr, Kind.NODES, EXPR_TAGS, min_count=min_count, what="an expression")


def _block(attr: str = "body") -> Field:
    return Field(attr, Kind.NODE, frozenset({BLOCK}), what="a block")


def _lit(kind: ConstKind, attrs: str = "value,text") -> Field:
    return Field(attrs, Kind.LITERAL, const=kind)


_ARGS = Field("args", Kind.NODES, frozenset({ARG}), what="an argument declaration")
_RESULTS = Field("results", Kind.OPT_NODES, frozenset({ARG}), what="a result declaration")

_FIELDS: dict[int, tuple[type, tuple[Field, ...]]] = {
    SCALAR_TYPE: (ast.ScalarTypeRef, (_enum("name", SCALAR_TYPES),)),
    TENSOR_TYPE: (ast.TensorTypeRef, (_enum("dtype", SCALAR_TYPES), _exprs("dims", 1))),
    DYN_TYPE: (ast.DynTypeRef, (_enum("name", DYN_TYPES),)),
    INT: (ast.IntLit, (_lit(ConstKind.INT),)),
    FLOAT: (ast.FloatLit, (_lit(ConstKind.FLOAT),)),
    STR: (ast.StrLit, (_lit(ConstKind.STR),)),
    BYTES: (ast.BytesLit, (_lit(ConstKind.BYTES),)),
    BOOL: (ast.BoolLit, (Field("value", Kind.BOOL),)),
    NULL: (ast.NullLit, ()),
    NAME: (ast.Name, (_name(),)),
    TYPE_NAME: (ast.TypeName, (_enum("name", TYPE_NAMES),)),
    BINARY: (ast.Binary, (_enum("op", BINARY_OPS), _expr("left"), _expr("right"))),
    UNARY: (ast.Unary, (_enum("op", UNARY_OPS), _expr("operand"))),
    CALL: (ast.Call, (_expr("callee"), _exprs("args"))),
    INDEX: (ast.Index, (_expr("base"), _exprs("indices", 1))),
    LIST: (ast.ListLit, (_exprs("items"),)),
    MAP: (ast.MapLit, (Field("items", Kind.PAIRS, EXPR_TAGS, what="an expression"),)),
    BITCAST: (ast.Bitcast, (_enum("dtype", SCALAR_TYPES), _expr("operand"))),
    PAREN: (ast.Paren, (_expr("inner"),)),
    LET: (ast.Let, (_name(), Field("type", Kind.OPT_TYPE), _expr("value"))),
    VAR: (ast.Var, (_name(), Field("type", Kind.OPT_TYPE), _opt_expr("value"))),
    ASSIGN: (ast.Assign, (_expr("target"), _enum("op", ASSIGN_OPS), _expr("value"))),
    EXPR_STMT: (ast.ExprStmt, (_expr("expr"),)),
    IF: (ast.If, (_expr("cond"), _block("then"),
                  Field("orelse", Kind.OPT_NODE, frozenset({BLOCK, IF}), what="a block or an if"))),
    FOR: (ast.For, (_name("var"), _expr("start"), _opt_expr("end"), _block())),
    PARALLEL_FOR: (ast.ParallelFor, (Field("binds", Kind.NODES, frozenset({RANGE_BIND}), min_count=1,
                                           what="a range binding"), _block())),
    WHILE: (ast.While, (_expr("cond"), _block())),
    RETURN: (ast.Return, (_opt_expr("value"),)),
    BREAK: (ast.Break, ()),
    CONTINUE: (ast.Continue, ()),
    EXPECT: (ast.Expect, (_expr("cond"),)),
    BLOCK: (ast.Block, (Field("stmts", Kind.NODES, STMT_TAGS, what="a statement"),)),
    RANGE_BIND: (ast.RangeBind, (_name("var"), _expr("start"), _expr("end"))),
    ARG: (ast.ArgDecl, (_enum("mode", ARG_MODES), _name(), Field("type", Kind.TYPE))),
    FAMILY: (ast.Family, (_name("var"), _expr("start"), _expr("end"))),
    IMPORT: (ast.ImportItem, (_name(), Field("alias", Kind.OPT_NAME))),
    USE: (ast.Use, (_lit(ConstKind.STR, "path,path_text"),
                    Field("imports", Kind.NODES, frozenset({IMPORT}), what="an import"))),
    CONFIG: (ast.Config, (_name(), Field("type", Kind.TYPE), _expr("value"))),
    PARAM: (ast.Param, (_name(), Field("family", Kind.OPT_NODE, frozenset({FAMILY}), what="a family"),
                        Field("type", Kind.TYPE), _expr("value"))),
    STATE: (ast.State, (_name(), Field("type", Kind.TYPE), _name("scope"))),
    KERNEL: (ast.Kernel, (_name(), _ARGS, _block())),
    COMMAND: (ast.Command, (_name(), _ARGS, _RESULTS, _block())),
    STAGE: (ast.Stage, (_name(), _ARGS, _RESULTS)),
    FN: (ast.Fn, (_name(), _ARGS, Field("ret", Kind.OPT_TYPE), _block())),
    CHECK: (ast.Check, (_name(), _block())),
}


def _span_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.type in ("Span", ast.Span))


SPECS: dict[int, NodeSpec] = {tag: NodeSpec(tag, cls, fields, _span_fields(cls))
                              for tag, (cls, fields) in _FIELDS.items()}
TAG_OF: dict[type, int] = {spec.cls: tag for tag, spec in SPECS.items()}


def describe(tag: int) -> str:
    """A tag as messages name it: `tag 48 (Let)`."""
    if tag == NONE:
        return "tag 0 (none)"
    spec = SPECS.get(tag)
    return f"tag {tag} ({spec.name})" if spec else f"unknown tag {tag}"


def item_has_name(tag: int) -> bool:
    """Items whose first field is their NAME, which the symbols section holds instead of the code."""
    fields = SPECS[tag].fields
    return bool(fields) and fields[0].kind is Kind.NAME and fields[0].attr == "name"

"""The lowered kernel IR: a closed set of frozen dataclasses, built by `loomc.lower.kernels`.

One vocabulary for every target. `lower/numba.py` renders it to Python for numba and the
CUDA renderer renders the same nodes to CUDA C, so the two cannot drift. Nothing here
knows about a target: no numpy types, no prange, no thread indices.

Every expression carries its `dtype` (one of `DTYPES`); operands of an operation have
exactly the types the operation states, because conversions are explicit (`Cast`,
`Bitcast`). Tensors are flat buffers: a `Load`/`Store` takes one `i64` element index that
the lowering computed from the tensor's dimensions (row-major). Block-quantized tensors
are read only through the three `Quant*` nodes, which address GGUF blocks directly.

Semantics every renderer must implement (`interpret.py` is the reference for scalars):

- integer `add sub mul neg shl` wrap modulo 2^bits (two's complement), signed or not;
  `div` truncates toward zero and `mod` takes the sign of the dividend (C); division by
  zero yields 0 rather than trapping (a kernel cannot fail); `shr` is arithmetic for
  signed and logical for unsigned types; a shift amount outside 0..bits-1 is undefined.
- float ops are IEEE in the node's dtype, one rounding per op, no contraction into fma
  and no reassociation; float `mod` is C `fmod`. f16/bf16 values round to their type after
  every op. `min(a, b)` is `b < a ? b : a` and `max(a, b)` is `b > a ? b : a` (so a NaN in
  `b` loses and a NaN in `a` wins, exactly like the select).
- `land`/`lor` short-circuit: the right operand is evaluated only when needed, so
  `i < n && x[i] > 0` never reads past `n`.
- a float -> integer `Cast` truncates toward zero and is undefined out of range; an integer
  -> narrower integer `Cast` wraps; `Cast(x, bool)` is `x != 0`. Casts from bool do not
  exist (the language spells them `select`).
- loop bounds are evaluated once, before the first iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from loomc import dtypes
from loomc.dtypes import is_float, is_int, is_unsigned  # noqa: F401 - part of this module's vocabulary

# ---- types: derived from `loomc.dtypes`, which holds the facts --------------------------------

INT_DTYPES = dtypes.names("signed", "unsigned")
UNSIGNED_DTYPES = dtypes.names("unsigned")
FLOAT_DTYPES = dtypes.names("float")
DTYPES = ("bool",) + INT_DTYPES + FLOAT_DTYPES
QUANT_DTYPES = dtypes.names("quantized")
BITS = {t: dtypes.DTYPES[t].bits for t in DTYPES}

# GGUF block geometry: elements per block along the last dimension (one number for all
# quantized types), bytes per block and where the codes start inside a block.
(QUANT_BLOCK_ELEMS,) = {dtypes.DTYPES[t].block_elems for t in QUANT_DTYPES}
QUANT_BLOCK_BYTES = {t: dtypes.DTYPES[t].block_bytes for t in QUANT_DTYPES}
QUANT_CODES_OFFSET = {t: dtypes.DTYPES[t].codes_offset for t in QUANT_DTYPES}


# ---- expressions: every node carries its dtype --------------------------------------------------

# Unary operators: arithmetic negation, boolean not, integer bitwise not.
UNARY_OPS = ("neg", "not", "invert")
# Binary operators, by group. Operands always share one dtype.
ARITH_OPS = ("add", "sub", "mul", "div", "mod")  # numbers; result = operand dtype
BIT_OPS = ("and", "or", "xor", "shl", "shr")  # integers; result = operand dtype
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")  # any type; result bool
LOGIC_OPS = ("land", "lor")  # bool, short-circuit; result bool
BINARY_OPS = ARITH_OPS + BIT_OPS + COMPARE_OPS + LOGIC_OPS
# Math intrinsics: name -> (arity, operand kind). "float": float operands, result the same
# type; "number": any non-bool number; "predicate": one float in, bool out.
MATH_FNS = {
    "exp": (1, "float"), "exp2": (1, "float"), "log": (1, "float"), "log2": (1, "float"),
    "sqrt": (1, "float"), "rsqrt": (1, "float"), "tanh": (1, "float"), "erf": (1, "float"),
    "sin": (1, "float"), "cos": (1, "float"), "floor": (1, "float"), "ceil": (1, "float"),
    "sigmoid": (1, "float"), "pow": (2, "float"), "fma": (3, "float"),
    "abs": (1, "number"), "min": (2, "number"), "max": (2, "number"),
    "isnan": (1, "predicate"), "isinf": (1, "predicate"),
}


@dataclass(frozen=True)
class Const:
    """A literal of `dtype` (Python bool, int or float); folded configs arrive as these."""

    dtype: str
    value: bool | int | float


@dataclass(frozen=True)
class Ref:
    """The value of a named scalar: a scalar parameter, a shape symbol, a loop or lane
    variable, or a local declared by `Declare`."""

    name: str
    dtype: str


@dataclass(frozen=True)
class Unary:
    op: str
    x: "Expr"
    dtype: str


@dataclass(frozen=True)
class Binary:
    op: str
    a: "Expr"
    b: "Expr"
    dtype: str


@dataclass(frozen=True)
class Select:
    """`cond ? a : b`; both values are evaluated (they are side-effect free)."""

    cond: "Expr"
    a: "Expr"
    b: "Expr"
    dtype: str


@dataclass(frozen=True)
class Math:
    fn: str
    args: tuple["Expr", ...]
    dtype: str


@dataclass(frozen=True)
class Cast:
    """A value conversion to `dtype` (see the module docstring for the rules)."""

    x: "Expr"
    dtype: str


@dataclass(frozen=True)
class Bitcast:
    """Reinterprets the bits of `x` as `dtype` of the same width (bool counts as 8 bits)."""

    x: "Expr"
    dtype: str


@dataclass(frozen=True)
class Load:
    """Element `index` (i64, flat, row-major) of a typed buffer parameter or local array."""

    buf: str
    index: "Expr"
    dtype: str


@dataclass(frozen=True)
class QuantScale:
    """The f16 scale `d` of flat block `block` (i64) of a quantized buffer, as f32."""

    buf: str
    block: "Expr"
    dtype: str = "f32"


@dataclass(frozen=True)
class QuantMin:
    """The f16 minimum `m` of flat block `block` of a q4_1 buffer, as f32."""

    buf: str
    block: "Expr"
    dtype: str = "f32"


@dataclass(frozen=True)
class QuantCode:
    """The stored code of element `sub * 16 + lane` of flat block `block` (all i64;
    0 <= sub < 2, 0 <= lane < 16), as i32: 0..15 for q4_0/q4_1 (element j sits in the low
    nibble of code byte j for j < 16 and in the high nibble of byte j - 16 otherwise) and
    -128..127 for q8_0. Splitting the element index as sub/lane keeps the byte address
    affine in `lane`, which is what lets a target vectorize a 16-lane loop over a block."""

    buf: str
    block: "Expr"
    sub: "Expr"
    lane: "Expr"
    dtype: str = "i32"


Expr = Union[Const, Ref, Unary, Binary, Select, Math, Cast, Bitcast, Load, QuantScale, QuantMin, QuantCode]
EXPR_KINDS = (Const, Ref, Unary, Binary, Select, Math, Cast, Bitcast, Load, QuantScale, QuantMin, QuantCode)


# ---- statements -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Declare:
    """A new scalar local. Names are unique within a kernel (the lowering renames)."""

    name: str
    dtype: str
    value: Expr
    mutable: bool = False


@dataclass(frozen=True)
class Assign:
    """Assigns a mutable scalar local declared in an enclosing scope of the same lane."""

    name: str
    value: Expr


@dataclass(frozen=True)
class LocalArray:
    """A fixed-size array local to one lane, `size` elements of `dtype`, zeroed each time
    this statement runs. Indexed flat by `Load`/`Store` like a buffer."""

    name: str
    dtype: str
    size: int


@dataclass(frozen=True)
class Store:
    """Writes element `index` of a writable buffer parameter or a local array."""

    buf: str
    index: Expr
    value: Expr


@dataclass(frozen=True)
class For:
    """Sequential `for var in start..end step step` (end exclusive, step a positive constant)."""

    var: str
    dtype: str
    start: Expr
    end: Expr
    body: tuple["Stmt", ...]
    step: int = 1


@dataclass(frozen=True)
class While:
    cond: Expr
    body: tuple["Stmt", ...]


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...] = ()


@dataclass(frozen=True)
class Break:
    pass


@dataclass(frozen=True)
class Continue:
    pass


@dataclass(frozen=True)
class Lane:
    """One dimension of the parallel loop: `var` runs over start..end."""

    var: str
    dtype: str
    start: Expr
    end: Expr


@dataclass(frozen=True)
class ParallelFor:
    """The kernel's one parallel loop: one lane per combination of the `lanes` variables;
    lanes may run concurrently and in any order. No lanes means a single serial lane."""

    lanes: tuple[Lane, ...]
    body: tuple["Stmt", ...]


Stmt = Union[Declare, Assign, LocalArray, Store, For, While, If, Break, Continue, ParallelFor]
STMT_KINDS = (Declare, Assign, LocalArray, Store, For, While, If, Break, Continue, ParallelFor)


# ---- kernels -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BufferParam:
    """A tensor argument as a flat buffer. `dims` are i64 expressions over constants and
    symbols (row-major). A quantized buffer holds the GGUF block bytes of `dims`."""

    name: str
    dtype: str  # a DTYPE or a QUANT_DTYPE
    dims: tuple[Expr, ...]
    writable: bool


@dataclass(frozen=True)
class ScalarParam:
    name: str
    dtype: str


@dataclass(frozen=True)
class SymbolParam:
    """A shape symbol, passed as an i64 scalar. The host derives it as
    `shape(buffer)[axis]` and checks every other dimension against it before launch."""

    name: str
    buffer: str
    axis: int


@dataclass(frozen=True)
class Source:
    path: str
    line: int


@dataclass(frozen=True)
class Kernel:
    """One launch: scalar `Declare`s (the prelude) followed by exactly one `ParallelFor`.

    `params` lists buffers and scalars in `.loom` argument order; the symbols follow them
    in a launch's argument list."""

    name: str
    params: tuple[BufferParam | ScalarParam, ...]
    symbols: tuple[SymbolParam, ...]
    body: tuple[Stmt, ...]
    source: Source


@dataclass(frozen=True)
class KernelGroup:
    """A `.loom` kernel: one IR `Kernel` per `parallel for`, launched in order with the
    same arguments. Almost every kernel has exactly one part."""

    name: str
    parts: tuple[Kernel, ...]
    source: Source
    configs: tuple[tuple[str, object], ...] = field(default=())  # folded configs it uses, for the header


def children(e: Expr) -> tuple[Expr, ...]:
    """The operand expressions of a node, in evaluation order."""
    if isinstance(e, (Const, Ref)):
        return ()
    if isinstance(e, (Unary, Cast, Bitcast)):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Math):
        return e.args
    if isinstance(e, Load):
        return (e.index,)
    if isinstance(e, (QuantScale, QuantMin)):
        return (e.block,)
    if isinstance(e, QuantCode):
        return (e.block, e.sub, e.lane)
    raise TypeError(f"not an IR expression: {e!r}")

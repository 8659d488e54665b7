"""Checker types: numeric scalars and tensors for kernels/commands, dynamic types for control code.

Integer and float literals are *untyped constants* (as in Go): they take the
type their context needs, which is not a cast. Everything else must match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from loomc.check.shapes import Dim
from loomc.dtypes import DTYPES, PANEL_TYPES, names

# Derived from `loomc.dtypes`, which holds the facts.
INT_TYPES = names("signed", "unsigned")
UNSIGNED_TYPES = names("unsigned")
FLOAT_TYPES = names("float")
QUANT_TYPES = names("quantized")
NUMERIC_TYPES = ("bool",) + INT_TYPES + FLOAT_TYPES
STORAGE_TYPES = NUMERIC_TYPES + QUANT_TYPES
DYN_TYPES = ("any", "null", "bool", "int", "float", "str", "bytes", "list", "map")

BITS = {t: DTYPES[t].bits for t in NUMERIC_TYPES}
INT_RANGES = {t: DTYPES[t].range for t in INT_TYPES}
# GGUF block geometry: elements per block along the last dimension.
QUANT_BLOCK = {t: DTYPES[t].block_elems for t in QUANT_TYPES}
# Panel types: rows per interleaved group (the second-last dimension is a multiple of it).
PANEL_ROWS = {t: DTYPES[t].panel_rows for t in PANEL_TYPES}
PLAIN_QUANT_TYPES = tuple(t for t in QUANT_TYPES if t not in PANEL_ROWS)   # what `quantize` makes


@dataclass(frozen=True)
class Scalar:
    name: str

    def __str__(self) -> str:
        return self.name

    @property
    def is_int(self) -> bool:
        return self.name in INT_TYPES

    @property
    def is_float(self) -> bool:
        return self.name in FLOAT_TYPES


@dataclass(frozen=True)
class Untyped:
    """An integer or float literal that has not yet met a type."""

    kind: str  # "int" | "float"

    def __str__(self) -> str:
        return f"{self.kind} literal"


@dataclass(frozen=True)
class Tensor:
    dtype: str
    dims: tuple[Dim, ...]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.dims)}]"

    @property
    def rank(self) -> int:
        return len(self.dims)


@dataclass(frozen=True)
class Dyn:
    name: str

    def __str__(self) -> str:
        return self.name


ANY = Dyn("any")
NULL = Dyn("null")
BOOL = Scalar("bool")
I64 = Scalar("i64")
F32 = Scalar("f32")
UNTYPED_INT = Untyped("int")
UNTYPED_FLOAT = Untyped("float")

CheckType = Scalar | Untyped | Tensor | Dyn


def default_type(t: CheckType) -> CheckType:
    """What an untyped literal becomes when nothing constrains it: i64 or f32."""
    if isinstance(t, Untyped):
        return I64 if t.kind == "int" else F32
    return t


def is_integral(t: CheckType) -> bool:
    return (isinstance(t, Scalar) and t.is_int) or t == UNTYPED_INT


def is_floating(t: CheckType) -> bool:
    return (isinstance(t, Scalar) and t.is_float) or t == UNTYPED_FLOAT

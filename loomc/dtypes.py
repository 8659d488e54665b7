"""Element types: one record per dtype, the one place their facts are written down.

Every other table of dtype facts is computed from `DTYPES`: the checker's (`check/types.py`),
the IR's (`ir/module.py`), the renderers' numpy and C spellings (`lower/numba.py`,
`lower/cuda_helpers.py`), the launcher's arrays (`run/launch.py`), the reference
interpreter's scalars (`ir/interpret.py`) and the checkpoint readers (`loomrt`).

Numpy types are named by their attribute of the numpy module ("float16" is `np.float16`),
so the compiler's front end reads this table without importing numpy; `numpy_type`
resolves a name. A tensor has two storages, named apart because they differ for f16:

- `host`: the numpy dtype of an array holding the tensor on the host: what the launcher
  allocates, what checkpoints yield, what callers pass. f16 is float16 (its uint16 bits
  are accepted too: `host_accepted`), bf16 is its uint16 bits (numpy has no bfloat16), and a
  quantized tensor of logical shape `[..., K]` is its GGUF block bytes, a uint8 array
  `[..., K / block_elems * block_bytes]`.
- `kernel`: the numpy dtype of the flat buffer a generated kernel indexes: `host`, except
  that f16 is uint16 bits too (neither numba's CPU target nor the CUDA renderer has a half
  type). The launcher views an f16 host array as its bits before a launch.

Values are computed in `compute`: f16/bf16 live in float32, rounded to their type after
every op. Quantized tensors have no scalar values: the kernel IR reads them only through
its `Quant*` nodes, which dequantize to f32.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("bool", "signed", "unsigned", "float", "quantized")


@dataclass(frozen=True)
class DType:
    name: str
    kind: str  # one of KINDS
    bits: int | None  # width of one element; None for quantized types (see block_bytes)
    numpy: str | None  # the numpy type whose values are exactly this type's (None: bf16, quantized)
    host: str  # numpy dtype of a host array holding a tensor of this type
    kernel: str  # numpy dtype of the buffer a generated kernel indexes
    compute: str | None  # numpy type a kernel computes values in (None: quantized)
    host_also: tuple[str, ...] = ()  # other host dtypes accepted (f16: its uint16 bits)
    # GGUF block quantization: elements per block along the last dimension, bytes per block,
    # and where the codes start in a block (after the f16 scale d, and for q4_1 the f16 min m).
    block_elems: int = 0
    block_bytes: int = 0
    codes_offset: int = 0
    # Panels: `panel_of`'s blocks with rows interleaved in groups of `panel_rows` (P). The
    # storage array keeps its shape; the P rows of group g hold, per block b, P * block_bytes
    # bytes: the P rows' scale fields, then the P rows' codes, each part `panel_unit` bytes
    # per row at a time ([unit][row][bytes]). Same bytes, another order: one stream per group,
    # and one load gives a field of all P rows, or a unit of all P rows' codes. Only the
    # integer-dot motifs read panels; only `repack` makes them.
    panel_of: str | None = None
    panel_rows: int = 0
    panel_unit: int = 0

    def __str__(self) -> str:
        return self.name

    @property
    def range(self) -> tuple[int, int]:
        """The smallest and largest value of an integer type."""
        if self.kind not in ("signed", "unsigned"):
            raise ValueError(f"{self.name} is not an integer type")
        if self.kind == "unsigned":
            return 0, 2 ** self.bits - 1
        return -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1

    @property
    def host_accepted(self) -> tuple[str, ...]:
        """The numpy dtypes a host array of this type may have; the first is the one allocated."""
        return (self.host,) + self.host_also


def _plain(name: str, kind: str, bits: int, numpy: str) -> DType:
    """A type numpy has: stored and computed as itself."""
    return DType(name, kind, bits, numpy, host=numpy, kernel=numpy, compute=numpy)


def _quantized(name: str, block_bytes: int, codes_offset: int) -> DType:
    return DType(name, "quantized", None, None, host="uint8", kernel="uint8", compute=None,
                 block_elems=32, block_bytes=block_bytes, codes_offset=codes_offset)


DTYPES: dict[str, DType] = {d.name: d for d in (
    _plain("bool", "bool", 8, "bool_"),
    *(_plain(f"i{b}", "signed", b, f"int{b}") for b in (8, 16, 32, 64)),
    *(_plain(f"u{b}", "unsigned", b, f"uint{b}") for b in (8, 16, 32, 64)),
    DType("f16", "float", 16, "float16", host="float16", kernel="uint16", compute="float32", host_also=("uint16",)),
    DType("bf16", "float", 16, None, host="uint16", kernel="uint16", compute="float32"),
    _plain("f32", "float", 32, "float32"),
    _plain("f64", "float", 64, "float64"),
    _quantized("q4_0", block_bytes=18, codes_offset=2),
    _quantized("q4_1", block_bytes=20, codes_offset=4),
    _quantized("q8_0", block_bytes=34, codes_offset=2),
    DType("q4_1x16", "quantized", None, None, host="uint8", kernel="uint8", compute=None, block_elems=32,
          block_bytes=20, codes_offset=4, panel_of="q4_1", panel_rows=16, panel_unit=2),
    DType("q8_0x16", "quantized", None, None, host="uint8", kernel="uint8", compute=None, block_elems=32,
          block_bytes=34, codes_offset=2, panel_of="q8_0", panel_rows=16, panel_unit=2),
)}

# Panel types: kernels cannot index them (a row's block b sits beside the other rows' blocks b,
# not after its own block b - 1).
PANEL_TYPES = tuple(d.name for d in DTYPES.values() if d.panel_of is not None)


def names(*kinds: str) -> tuple[str, ...]:
    """The names of the dtypes of the given kinds, in table order."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown dtype kind(s): {sorted(unknown)}")
    return tuple(d.name for d in DTYPES.values() if d.kind in kinds)


def _kind(name: str) -> str | None:
    d = DTYPES.get(name)
    return d.kind if d is not None else None


def is_int(name: str) -> bool:
    return _kind(name) in ("signed", "unsigned")


def is_unsigned(name: str) -> bool:
    return _kind(name) == "unsigned"


def is_float(name: str) -> bool:
    return _kind(name) == "float"


def numpy_type(name: str) -> type:
    """The numpy scalar type with this attribute name ("float16" -> `np.float16`)."""
    import numpy as np  # noqa: PLC0415 - only the back end needs numpy

    return getattr(np, name)


__all__ = ["DTYPES", "DType", "KINDS", "PANEL_TYPES", "is_float", "is_int", "is_unsigned", "names", "numpy_type"]

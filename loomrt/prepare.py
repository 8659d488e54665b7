"""The weight-preparation program: run a checked program's `param` declarations on a checkpoint.

    prepare_params(plan, checkpoint) -> {name: array, family: [array per member]}

`plan` is a component's `PreparePlan` from the `CompiledModule` (loomc lowers the `param`
declarations with every constant folded), so nothing here reads compiler syntax.

The result is exactly what `CommandProgram.run(params=...)` binds (see `loomc.run.launch`):
numeric params are C-contiguous numpy arrays of their dtype (f16 as float16, bf16 as
uint16 bits), q4_0/q4_1/q8_0 params are GGUF block bytes, uint8 `[..., K / 32 * bpb]`.
A family `[l in a..b]` becomes a list of its members in index order. Arrays straight from
the checkpoint are passed through without copying (memory-mapped, read-only).

Preparation functions: `checkpoint("name")` (family index `{l}` substituted),
`transpose(t)` (axes reversed; numeric only), `cast(t, DTYPE)` (numeric; a quantized `t`
is dequantized), `concat([...], axis)` (same dtype; quantized along any axis, the last in
whole blocks), `reshape(t, [dims])` (same element count; quantized keeps whole blocks) and
`quantize(t, QTYPE)` (from a float tensor, with `gguf.quants.quantize`) and `repack(t, PANEL)`
(a q4_1 or q8_0 tensor's blocks reordered into 16-row panels: same bytes). Each result must
match the declared type exactly, or a `PrepareError` names the param, the member and the
checkpoint tensors, e.g. `param 'wq'[3] (blk.3.attn_q.weight): expected q4_1[576, 576],
got q4_1[576, 512]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loomc.ir import module as ir
from loomc.dtypes import DTYPES
from loomc.lower.prepare import (Cast, Compute, Concat, Constant, FromCheckpoint, ParamPlan, Prep, PreparePlan,
                                 Quantize, Repack, Reshape, Transpose)
from loomrt.checkpoints import Checkpoint
from loomrt.errors import CheckpointError, LoomError, PrepareError, run_errors
from loomc.run.launch import STORAGE

QUANT = ir.QUANT_DTYPES
BLOCK = ir.QUANT_BLOCK_ELEMS


def _gguf_type(qtype: str):
    from gguf import GGMLQuantizationType
    return GGMLQuantizationType[qtype.upper()]


@dataclass
class Value:
    """A tensor during preparation: its `.loom` dtype, its storage array, its logical shape."""

    dtype: str
    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        s = self.array.shape
        if self.dtype in QUANT:
            return s[:-1] + (s[-1] // ir.QUANT_BLOCK_BYTES[self.dtype] * BLOCK,)
        return tuple(s)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


class _Failure(Exception):
    """Raised inside one param's preparation; `prepare_params` adds which param it was."""


def panel_order(array: np.ndarray, dtype: str, forward: bool = True) -> np.ndarray:
    """The storage of a `dtype.panel_of` tensor (uint8 `[..., N, bytes]`) in `dtype`'s panel
    order (forward), or back in plain row order: per group of P rows and per block, the P
    rows' scale fields, then their codes, each part unit by unit (`DType.panel_unit`). A new
    array; the same bytes."""
    d = DTYPES[dtype]
    p, size, head, unit = d.panel_rows, d.block_bytes, d.codes_offset, d.panel_unit
    *lead, rows, width = array.shape
    groups, blocks = rows // p, width // size
    out = np.empty(array.shape, np.uint8)
    plain, panels = (array, out) if forward else (out, array)
    if unit in (2, 4, 8) and size % unit == 0 and head % unit == 0 and array.flags.c_contiguous:
        # a unit as one element (uint16 for 2 bytes): numpy copies whole elements, not runs of
        # `unit` bytes (scout's LM head: 60 -> 19 ms)
        plain, panels = (a.view(f"u{unit}") for a in (plain, panels))
        size, head, unit = size // unit, head // unit, 1
    by_row = plain.reshape(*lead, groups, p, blocks, size)
    by_block = panels.reshape(*lead, groups, blocks, p * size)
    for start, stop in ((0, head), (head, size)):
        units = (stop - start) // unit
        # the part as [..., group, block, unit, row, bytes] in the panels and, by the same
        # indices, in plain rows: views, copied without a temporary
        part = by_block[..., p * start:p * stop].reshape(*lead, groups, blocks, units, p, unit)
        rowwise = np.moveaxis(by_row[..., start:stop].reshape(*lead, groups, p, blocks, units, unit), -4, -2)
        assert np.may_share_memory(part if forward else rowwise, out)   # a view, not a copy
        if forward:
            np.copyto(part, rowwise)
        else:
            np.copyto(rowwise, part)
    return out


def _repack(v: Value, dtype: str) -> Value:
    d = DTYPES[dtype]
    if v.dtype != d.panel_of:
        raise _Failure(f"repack to {dtype} takes a {d.panel_of} tensor, got {v}")
    if len(v.shape) < 2 or v.shape[-2] % d.panel_rows:
        raise _Failure(f"repack to {dtype} needs a second-last dimension that is a multiple of {d.panel_rows}, got {v}")
    return Value(dtype, panel_order(np.ascontiguousarray(v.array), dtype))


def _to_float(v: Value) -> np.ndarray:
    """A float array of the same logical shape (quantized blocks dequantized, bf16 widened)."""
    if DTYPES[v.dtype].panel_of is not None:
        return _to_float(Value(DTYPES[v.dtype].panel_of, panel_order(v.array, v.dtype, forward=False)))
    if v.dtype in QUANT:
        from gguf.quants import dequantize
        return dequantize(v.array, _gguf_type(v.dtype))
    if v.dtype == "bf16":
        return (v.array.astype(np.uint32) << 16).view(np.float32)
    return v.array


def _cast(v: Value, dtype: str) -> Value:
    if dtype == v.dtype:
        return v
    src = _to_float(v) if v.dtype in QUANT or v.dtype == "bf16" else v.array
    if dtype == "bf16":
        bits = np.ascontiguousarray(src, dtype=np.float32).view(np.uint32)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
        out = np.where(np.isnan(src), (bits >> 16) | 0x40, rounded >> 16).astype(np.uint16)
        return Value(dtype, out)
    if dtype == "bool":
        return Value(dtype, src != 0)
    return Value(dtype, src.astype(STORAGE[dtype]))


def _quantize(v: Value, qtype: str) -> Value:
    if v.dtype in QUANT:
        raise _Failure(f"quantize takes a numeric tensor, got {v} (already block-quantized)")
    if not v.shape or v.shape[-1] % BLOCK:
        raise _Failure(f"quantize to {qtype} needs a last dimension that is a multiple of {BLOCK}, got {v}")
    try:
        from gguf.quants import quantize
    except ImportError:  # pragma: no cover - depends on the installed gguf
        raise _Failure(f"quantize to {qtype} is unsupported: this gguf package has no gguf.quants.quantize") from None
    src = np.ascontiguousarray(_to_float(v), dtype=np.float32)
    try:
        return Value(qtype, np.ascontiguousarray(quantize(src, _gguf_type(qtype))))
    except NotImplementedError:  # pragma: no cover - depends on the installed gguf
        raise _Failure(f"quantize to {qtype} is unsupported by the installed gguf package") from None


def _concat(values: list[Value], axis: int) -> Value:
    dtypes = {v.dtype for v in values}
    if len(dtypes) != 1:
        raise _Failure(f"concat needs tensors of one dtype, got {', '.join(map(str, values))}")
    rank = {len(v.shape) for v in values}
    if len(rank) != 1:
        raise _Failure(f"concat needs tensors of one rank, got {', '.join(map(str, values))}")
    n = rank.pop()
    if not -n <= axis < n:
        raise _Failure(f"concat axis {axis} is outside the {n} dimensions of {values[0]}")
    axis %= n
    if DTYPES[values[0].dtype].panel_of is not None and axis == n - 1:
        raise _Failure(f"concat of {values[0].dtype} along its last axis would split its panels; concat before repack")
    for v in values[1:]:
        if any(a != b for i, (a, b) in enumerate(zip(v.shape, values[0].shape)) if i != axis):
            raise _Failure(f"concat along axis {axis}: {values[0]} and {v} differ in another dimension")
    # Quantized storage concatenates along the byte axis too: every row's blocks are independent.
    return Value(values[0].dtype, np.concatenate([v.array for v in values], axis=axis))


def _reshape(v: Value, dims: list[int]) -> Value:
    count = int(np.prod(v.shape, dtype=np.int64))
    if int(np.prod(dims, dtype=np.int64)) != count:
        raise _Failure(f"cannot reshape {v} ({count} elements) to [{', '.join(map(str, dims))}]")
    if DTYPES[v.dtype].panel_of is not None:
        raise _Failure(f"cannot reshape {v}: its rows are interleaved in panels; reshape before repack")
    if v.dtype in QUANT:
        if not dims or dims[-1] % BLOCK:
            raise _Failure(f"cannot reshape {v} to [{', '.join(map(str, dims))}]: {v.dtype} keeps whole blocks "
                           f"of {BLOCK} along the last dimension")
        # Blocks are laid out row-major, so the flat block sequence is the same for any such shape.
        storage = tuple(dims[:-1]) + (dims[-1] // BLOCK * ir.QUANT_BLOCK_BYTES[v.dtype],)
        return Value(v.dtype, np.ascontiguousarray(v.array).reshape(storage))
    return Value(v.dtype, np.ascontiguousarray(v.array).reshape(dims))


class _Kernels:
    """The plan's `compute` kernels, compiled for the cpu on first use (numba caches them on disk)."""

    def __init__(self, plan: PreparePlan, cache_dir: Path | None):
        self.plan, self.cache_dir = plan, cache_dir
        self._launchers: dict | None = None

    def run(self, key: str, args: list, out: np.ndarray) -> None:
        from loomc.run.compile import compile_kernels

        if self._launchers is None:
            with run_errors():
                self._launchers = compile_kernels(dict(self.plan.kernels), "cpu", self.cache_dir)
        try:
            with run_errors():
                self._launchers[key](*args, out)
        except LoomError as exc:
            raise _Failure(f"compute({key.rsplit(':', 1)[-1]}): {exc.message}") from None


class _Member:
    """Evaluates one param member's preparation (the plan's `Prep` tree) on the checkpoint."""

    def __init__(self, param: ParamPlan, checkpoint: Checkpoint, index: int | None, kernels: _Kernels):
        self.param, self.checkpoint, self.index, self.kernels = param, checkpoint, index, kernels
        self.names: list[str] = []

    def eval(self, e: Prep) -> Value:
        if isinstance(e, Compute):
            args = [a.value if isinstance(a, Constant) else self.eval(a).array for a in e.args]
            out = np.zeros(self.param.dims, STORAGE[self.param.dtype])
            self.kernels.run(e.kernel, args, out)
            return Value(self.param.dtype, out)
        if isinstance(e, FromCheckpoint):
            name = e.name
            if self.param.family_var is not None:
                name = name.replace("{" + self.param.family_var + "}", str(self.index))
            self.names.append(name)
            if name not in self.checkpoint:
                raise _Failure(self.checkpoint.missing(name))
            info = self.checkpoint.info(name)
            try:
                return Value(info.dtype, self.checkpoint.get(name))
            except CheckpointError as exc:
                raise _Failure(exc.message) from None
        if isinstance(e, Transpose):
            v = self.eval(e.source)
            if v.dtype in QUANT:
                raise _Failure(f"cannot transpose {v}: block-quantized tensors keep their blocks; "
                               "transpose before quantize")
            return Value(v.dtype, np.ascontiguousarray(v.array.T))
        if isinstance(e, Cast):
            return _cast(self.eval(e.source), e.dtype)
        if isinstance(e, Quantize):
            return _quantize(self.eval(e.source), e.dtype)
        if isinstance(e, Repack):
            return _repack(self.eval(e.source), e.dtype)
        if isinstance(e, Concat):
            return _concat([self.eval(item) for item in e.sources], e.axis)
        if isinstance(e, Reshape):
            return _reshape(self.eval(e.source), list(e.dims))
        raise _Failure(f"unknown preparation {type(e).__name__}")


def prepare_params(plan: PreparePlan, checkpoint: Checkpoint | None, cache_dir: Path | None = None,
                   prepared: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray | list[np.ndarray]]:
    """Run every param of a component's plan against `checkpoint` (None when every param is
    computed); the result binds as `run(params=...)`. `compute` kernels compile under `cache_dir`.
    `prepared` is told (tensors prepared, total) before the first and after each (a family
    counts each member)."""
    kernels = _Kernels(plan, cache_dir)
    total = sum(1 if p.family is None else len(range(*p.family)) for p in plan.params)
    done = 0

    def one(param: ParamPlan, index: int | None) -> np.ndarray:
        nonlocal done
        array = _prepare_one(param, checkpoint, index, kernels)
        done += 1
        if prepared is not None:
            prepared(done, total)
        return array

    if prepared is not None:
        prepared(0, total)
    out: dict[str, np.ndarray | list[np.ndarray]] = {}
    for param in plan.params:
        if param.family is None:
            out[param.name] = one(param, None)
        else:
            out[param.name] = [one(param, i) for i in range(*param.family)]
    return out


def _prepare_one(param: ParamPlan, checkpoint: Checkpoint, index: int | None, kernels: _Kernels) -> np.ndarray:
    member = _Member(param, checkpoint, index, kernels)

    def where() -> str:
        at = f"[{index}]" if index is not None else ""
        return f"param '{param.name}'{at} ({', '.join(member.names) or 'no checkpoint tensor'})"

    try:
        v = member.eval(param.value)
    except _Failure as exc:
        raise PrepareError(f"{where()}: {exc}", param=param.name) from None
    if v.dtype != param.dtype or v.shape != param.dims:
        raise PrepareError(f"{where()}: expected {param.declared}, got {v}", param=param.name)
    array = v.array
    if param.dtype == "f16" and array.dtype == np.uint16:  # pragma: no cover - no source yields f16 bits today
        array = array.view(np.float16)
    return np.ascontiguousarray(array)


__all__ = ["Value", "panel_order", "prepare_params"]

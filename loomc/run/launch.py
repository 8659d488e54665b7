"""Host-side kernel launchers: numpy arrays in, a lowered kernel's flat argument tuple out.

A `KernelLauncher` is what a command program (`loomc.run.dispatch`) and the numerics tests
call. `bind` does all the checking a launch needs, once: it derives each shape symbol
from the argument it comes from, checks every dimension, dtype, contiguity and
writability, and flattens the arrays to the 1-D views the kernels index. After that,
launching is calling the part functions with the tuple, so nothing inside a parallel loop
ever needs to check a bound.

Storage: numeric tensors are numpy arrays of their dtype (f16 as float16 or uint16 bits,
bf16 as uint16 bits). A q4_0/q4_1/q8_0 tensor of logical shape `[..., K]` is the GGUF
block bytes: a uint8 array of shape `[..., K / 32 * bytes_per_block]`, exactly the GGUF
file's bytes (`loomrt.checkpoint_gguf`), used in place. These are the `host` storage of
`loomc.dtypes`; `flat_view` gives the `kernel` storage a kernel indexes.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from loomc.dtypes import DTYPES, numpy_type
from loomc.ir import interpret
from loomc.ir import module as ir
from loomc.run.errors import KernelArgumentError
from loomc.run.kernel_thread import on_kernel_thread

# The numpy type of a host array holding each dtype (`loomc.dtypes`' `host` storage: f16 as
# float16, bf16 as uint16 bits, quantized as uint8 GGUF bytes), and every dtype such an array
# may have (f16 also as its uint16 bits). A kernel indexes the `kernel` storage: `flat_view`.
HOST_STORAGE = {t: numpy_type(d.host) for t, d in DTYPES.items()}
STORAGE = HOST_STORAGE  # the name existing callers import
HOST_DTYPES = {t: tuple(np.dtype(numpy_type(name)) for name in d.host_accepted) for t, d in DTYPES.items()}
_KERNEL_DTYPES = {t: np.dtype(numpy_type(d.kernel)) for t, d in DTYPES.items()}


def storage_shape(dtype: str, dims: Sequence[int]) -> tuple[int, ...]:
    """The numpy shape holding a tensor of `dtype` with logical `dims`."""
    dims = tuple(int(d) for d in dims)
    if dtype in ir.QUANT_DTYPES:
        return dims[:-1] + (dims[-1] // ir.QUANT_BLOCK_ELEMS * ir.QUANT_BLOCK_BYTES[dtype],)
    return dims


def logical_dim(dtype: str, shape: tuple[int, ...], axis: int) -> int:
    """Logical size of `axis` of a stored array (the last axis of quantized storage is bytes)."""
    if dtype in ir.QUANT_DTYPES and axis == len(shape) - 1:
        block_bytes = ir.QUANT_BLOCK_BYTES[dtype]
        return shape[axis] // block_bytes * ir.QUANT_BLOCK_ELEMS if shape[axis] % block_bytes == 0 else -1
    return shape[axis]


def flat_view(dtype: str, array: np.ndarray) -> np.ndarray:
    """The 1-D view a kernel indexes (f16 as its uint16 bits)."""
    kernel = _KERNEL_DTYPES[dtype]
    if array.dtype != kernel:
        array = array.view(kernel)
    return array.reshape(-1)


def allocate(dtype: str, dims: Sequence[int]) -> np.ndarray:
    return np.zeros(storage_shape(dtype, dims), HOST_STORAGE[dtype])


def _dim_value(d: ir.Expr, env: dict[str, int]) -> int:
    """A buffer dimension's value: a symbol or constant read directly (most of them; a new
    shape binds every dispatch of a command, hundreds of buffers), anything else evaluated."""
    if type(d) is ir.Ref and d.dtype == "i64":
        return int(env[d.name])
    if type(d) is ir.Const and d.dtype == "i64":
        return int(d.value)
    return int(interpret.evaluate(d, env))


class KernelLauncher:
    """Launches one lowered `.loom` kernel (all its parts, in order) on numpy arrays."""

    def __init__(self, group: ir.KernelGroup, functions: Sequence[Any]):
        first = group.parts[0]
        self.name = group.name
        self.group = group
        self.params = first.params
        self.symbols = first.symbols
        self.functions = tuple(functions)
        self._positions = {p.name: i for i, p in enumerate(self.params)}
        # what `bind` reads per launch, worked out once: each symbol's source (name, position,
        # axis, dtype of the buffer) and the positions those sources occupy
        self._sources = [(s.name, self._positions[s.buffer], s.axis, self.params[self._positions[s.buffer]].dtype)
                         for s in self.symbols]
        self._source_positions = sorted({position for _, position, _, _ in self._sources})
        # buffers whose every dimension is a symbol read from that very axis of the buffer
        # itself: their shape is the one it implies, nothing to compute or compare
        sourced = {(name, position, axis) for name, position, axis, dtype in self._sources if dtype not in ir.QUANT_DTYPES}
        self._self_shaped = [not isinstance(p, ir.ScalarParam) and all(
            type(d) is ir.Ref and (d.name, position, axis) in sourced for axis, d in enumerate(p.dims))
            for position, p in enumerate(self.params)]

    def __repr__(self) -> str:
        return f"<KernelLauncher {self.name}: {len(self.functions)} part(s)>"

    def fail(self, message: str) -> KernelArgumentError:
        return KernelArgumentError(f"kernel {self.name}: {message}")

    def bind(self, *values: Any, checked: bool = False) -> tuple:
        """Check `values` (one per `.loom` argument) and return the launch argument tuple.
        `checked`: the caller vouches that every array already has its declared dtype, rank,
        C order and, where written, writability (a command's ShapePlan: it checked or made
        each one); the shapes are still checked against the kernel's dimensions."""
        if len(values) != len(self.params):
            raise self.fail(f"takes {len(self.params)} arguments, got {len(values)}")
        if not checked:
            for position in self._source_positions:
                self.check_array(self.params[position], values[position])
        env: dict[str, int] = {}
        for name, position, axis, dtype in self._sources:
            env[name] = logical_dim(dtype, values[position].shape, axis)
        flat: list[Any] = []
        for position, (p, value) in enumerate(zip(self.params, values)):
            if isinstance(p, ir.ScalarParam):
                flat.append(self.scalar(p, value))
                continue
            if not self._self_shaped[position]:   # (a self-shaped one was checked with the sources)
                if not checked and position not in self._source_positions:
                    self.check_array(p, value)
                want = tuple(_dim_value(d, env) for d in p.dims)
                if want and min(want) < 0:
                    raise self.fail(f"'{p.name}' would have dimensions {want}")
                expected = storage_shape(p.dtype, want)
                if value.shape != expected:
                    shown = f"{p.dtype}{list(want)}" + (f" (stored as uint8{list(expected)})" if p.dtype in ir.QUANT_DTYPES else "")
                    raise self.fail(f"'{p.name}' must be {shown} given {self.symbol_text(env)}, got shape {list(value.shape)}")
            flat.append(flat_view(p.dtype, value))
        flat += [env[s.name] for s in self.symbols]
        return tuple(flat)

    def symbol_text(self, env: dict[str, int]) -> str:
        return ", ".join(f"{k} = {v}" for k, v in sorted(env.items())) or "no symbols"

    array_kind = "numpy"

    def array_class(self) -> type:
        """The array type this target's kernels take (numpy here, CuPy for CUDA)."""
        return np.ndarray

    def check_array(self, p: ir.BufferParam, value: Any) -> None:
        if not isinstance(value, self.array_class()):
            raise self.fail(f"'{p.name}' must be a {self.array_kind} array, got {type(value).__name__}")
        allowed = HOST_DTYPES[p.dtype]
        if value.dtype not in allowed:
            raise self.fail(f"'{p.name}' is {p.dtype}: expected a {allowed[0]} array, got {value.dtype}")
        if value.ndim != len(p.dims):
            raise self.fail(f"'{p.name}' has {len(p.dims)} dimensions, got an array of {value.ndim}")
        if not value.flags.c_contiguous:
            raise self.fail(f"'{p.name}' must be C-contiguous")
        self.check_writable(p, value)

    def check_writable(self, p: ir.BufferParam, value: Any) -> None:
        if p.writable and not value.flags.writeable:
            raise self.fail(f"'{p.name}' is written by the kernel, but the array is read-only")

    def scalar(self, p: ir.ScalarParam, value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if p.dtype == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise self.fail(f"'{p.name}' is bool, got {value!r}")
            return bool(value)
        if ir.is_int(p.dtype):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise self.fail(f"'{p.name}' is {p.dtype}, got {value!r}")
            if interpret.wrap(int(value), p.dtype) != int(value):
                raise self.fail(f"'{p.name}' is {p.dtype}; {int(value)} does not fit")
            return HOST_STORAGE[p.dtype](value)
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, (bool, np.bool_)):
            raise self.fail(f"'{p.name}' is {p.dtype}, got {value!r}")
        return np.float64(value) if p.dtype == "f64" else np.float32(value)

    def argument_examples(self) -> tuple:
        """One value of each launch argument's exact type (what `bind` passes: flat kernel
        storage, scalars in their host types, symbols as Python ints), from which a target
        compiles the parts before their first launch (`loomc.run.ahead`)."""
        out: list[Any] = []
        for p in self.params:
            if isinstance(p, ir.ScalarParam):
                if p.dtype == "bool":
                    out.append(False)
                elif ir.is_int(p.dtype):
                    out.append(HOST_STORAGE[p.dtype](0))
                else:
                    out.append(np.float64(0) if p.dtype == "f64" else np.float32(0))
            else:
                out.append(np.zeros(0, _KERNEL_DTYPES[p.dtype]))
        return tuple(out) + (0,) * len(self.symbols)

    def launch(self, args: tuple) -> None:
        """Run the parts with `bind`'s tuple, on the kernel thread (`loomc.run.kernel_thread`)."""
        on_kernel_thread(self._launch, args)

    def _launch(self, args: tuple) -> None:
        for f in self.functions:
            f(*args)

    def __call__(self, *values: Any) -> None:
        self.launch(self.bind(*values))

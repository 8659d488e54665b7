"""The CUDA target at run time: one `cupy.RawModule` per compiled kernel set, launched by plan.

`compile_kernels(groups)` renders the set with `loomc.lower.cuda.render_module`, hands the
text to `cupy.RawModule` with `COMPILE_OPTIONS` (NVRTC compiles on first use and CuPy
caches the binary on disk, keyed by the source and options), and returns one
`CudaKernelLauncher` per kernel. A launcher binds exactly like the CPU one (the same
`loomc.run.launch.KernelLauncher.bind` checks of every shape, dtype and contiguity, so no
kernel ever needs a bounds check) but takes CuPy arrays, and launches each part with its
`LaunchPlan`: scalars go as exact numpy dtypes, shape symbols as int64.

This module imports without CuPy and without a GPU; CuPy is imported on first use, and
`available()` says whether launching can work here and, if not, why.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from loomc.ir import module as ir
from loomc.lower.cuda import COMPILE_OPTIONS, LaunchPlan, render_module
from loomc.run.launch import KernelLauncher


@dataclass(frozen=True)
class Availability:
    """Whether CUDA kernels can run in this process; false with the reason when not."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


@functools.cache
def available() -> Availability:
    try:
        import cupy
    except ImportError as exc:
        return Availability(False, f"CuPy is not installed ({exc})")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver or device
        return Availability(False, f"no CUDA device: {exc}")
    if count == 0:
        return Availability(False, "no CUDA device")
    return Availability(True, f"{count} CUDA device(s)")


def _cupy():
    import cupy

    return cupy


class CudaKernelLauncher(KernelLauncher):
    """Launches one lowered `.loom` kernel (all its parts, in order, on the current stream)
    on CuPy arrays."""

    def __init__(self, group: ir.KernelGroup, functions, plans: tuple[LaunchPlan, ...]):
        super().__init__(group, functions)
        self.plans = plans

    array_kind = "cupy"

    def array_class(self) -> type:
        return _cupy().ndarray

    def check_writable(self, p: ir.BufferParam, value: Any) -> None:
        """CuPy arrays have no read-only flag: every device buffer is writable."""

    def bind(self, *values: Any, checked: bool = False) -> tuple:
        """The CPU checks, then the exact argument types the C signature declares: bool
        scalars as one byte, f16/bf16 scalars as float32, symbols as int64."""
        args = list(super().bind(*values, checked=checked))
        for i, p in enumerate(self.params):
            if isinstance(p, ir.ScalarParam) and p.dtype == "bool":
                args[i] = np.uint8(args[i])
        first_symbol = len(self.params)
        for i in range(first_symbol, len(args)):
            args[i] = np.int64(args[i])
        return tuple(args)

    def launch(self, args: tuple) -> None:
        env = {p.name: a for p, a in zip(self.params, args) if isinstance(p, ir.ScalarParam)}
        env.update((s.name, int(a)) for s, a in zip(self.symbols, args[len(self.params):]))
        for function, plan in zip(self.functions, self.plans):
            blocks = plan.grid_blocks(env)
            if blocks:
                function((blocks,), (plan.block_threads,), args)


def compile_kernels(groups: Mapping[str, ir.KernelGroup]) -> dict[str, CudaKernelLauncher]:
    """One RawModule for the whole set, one launcher per key of `groups`."""
    cupy = _cupy()
    module = render_module(groups)
    raw = cupy.RawModule(code=module.text, options=COMPILE_OPTIONS)
    launchers = {}
    for key, group in groups.items():
        plans = module.launches[key]
        launchers[key] = CudaKernelLauncher(group, [raw.get_function(p.function) for p in plans], plans)
    return launchers


def compile_group(group: ir.KernelGroup) -> CudaKernelLauncher:
    return compile_kernels({group.name: group})[group.name]

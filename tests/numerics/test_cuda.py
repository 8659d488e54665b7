"""The CUDA target against the CPU: the motif and scalar-semantics numerics again, on CUDA code.

The test functions of the CPU numerics modules in CPU_NUMERICS are collected again in
this module, where their `kernel` and `k` fixtures resolve to the ones below: each call
runs the kernel as CUDA code *and* as the numba kernel on copies of the same arguments,
asserts that the two targets agree, and leaves the CUDA results in the caller's arrays for
the test's own reference checks. Two tiers run every test:

- `host`: the module text that `loomc.run.cuda` would compile, built by g++ behind a small
  shim that runs the grid serially (`blockIdx`/`threadIdx` are globals, one call per
  thread). No GPU: statements, launch plans, the grid-stride mapping and the GGUF
  addressing are checked end to end in every CI run. The math library is glibc's, so
  transcendental functions match numba's (which calls the same libm) rather than CUDA's.
- `gpu` (`@pytest.mark.cuda`): the same text through `cupy.RawModule` on a device, skipped
  with the reason when CuPy or a device is missing.
"""

import copy
import ctypes
import dataclasses
import inspect
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import test_attention
import test_gather_embed
import test_norms_activations
import test_quant_matmul
import test_rope
import test_sampling
import test_scalar_semantics

from loomc.check import load_files
from loomc.ir import module as ir
from loomc.lower import cuda
from loomc.run.compile import compile_kernels
from loomc.lower.kernels import lower_kernel
from loomc.syntax import ast
from loomc.run import cuda as run_cuda
from loomc.run.launch import KernelLauncher

CXX = shutil.which("g++") or shutil.which("c++")
TIERS = ["host", pytest.param("gpu", marks=pytest.mark.cuda)]
CPU_NUMERICS = (test_attention, test_gather_embed, test_norms_activations, test_quant_matmul, test_rope, test_sampling,
                test_scalar_semantics)

# Every CPU numerics test of those modules that calls kernels through `kernel` or `k`
# becomes a test of this module too (with its parametrization), so a new CPU test runs on
# CUDA code without anyone remembering to add it here.
_collected: set[str] = set()
for _module in CPU_NUMERICS:
    for _name, _test in vars(_module).items():
        if inspect.isfunction(_test) and _name.startswith("test_") \
                and {"kernel", "k"} & set(inspect.signature(_test).parameters):
            assert _name not in _collected, f"two CPU numerics tests are named {_name}"
            _collected.add(_name)
            globals()[_name] = _test


def kernel_groups(checked) -> dict[str, ir.KernelGroup]:
    return {item.name: lower_kernel(checked.core, info, item) for info in checked.modules
            for item in info.module.items if isinstance(item, ast.Kernel)}


# ---- the host tier: CUDA C on the CPU, one serial call per thread ----------------------------------

_SHIM = """\
#include <math.h>
struct lm_dim3 { unsigned int x, y, z; };
static lm_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
"""
_CTYPE = {"bool": ctypes.c_uint8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
          "i64": ctypes.c_int64, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
          "u64": ctypes.c_uint64, "f16": ctypes.c_float, "bf16": ctypes.c_float, "f32": ctypes.c_float,
          "f64": ctypes.c_double}


def _grid_runner(text: str, function: str) -> str:
    """A C function that runs `function`'s whole grid serially, one call per thread."""
    params = re.search(rf'extern "C" __global__ void {function}\((.*)\) {{', text).group(1)
    names = [p.split()[-1].lstrip("*") for p in params.split(", ")]
    return (f'extern "C" void run_{function}(unsigned int lm_grid, unsigned int lm_block, {params}) {{\n'
            "    gridDim.x = lm_grid; blockDim.x = lm_block;\n"
            "    for (unsigned int b = 0; b < lm_grid; ++b) for (unsigned int t = 0; t < lm_block; ++t) {\n"
            f"        blockIdx.x = b; threadIdx.x = t; {function}({', '.join(names)});\n    }}\n}}\n")


class _HostFunction:
    """Called like a cupy RawKernel: (grid, block, args)."""

    def __init__(self, library, kernel: ir.Kernel, function: str):
        self.run = getattr(library, f"run_{function}")
        types = [ctypes.c_void_p if isinstance(p, ir.BufferParam) else _CTYPE[p.dtype] for p in kernel.params]
        self.run.argtypes = [ctypes.c_uint, ctypes.c_uint] + types + [ctypes.c_int64] * len(kernel.symbols)
        self.run.restype = None

    def __call__(self, grid, block, args):
        plain = (a.ctypes.data if isinstance(a, np.ndarray) else a.item() if isinstance(a, np.generic) else a
                 for a in args)
        self.run(grid[0], block[0], *plain)


class _HostLauncher(run_cuda.CudaKernelLauncher):
    """numpy arrays stand in for device arrays, with the CPU launcher's checks."""

    array_kind = KernelLauncher.array_kind
    array_class = KernelLauncher.array_class
    check_writable = KernelLauncher.check_writable


def compile_on_host(groups: dict[str, ir.KernelGroup], build_dir: Path) -> dict:
    module = cuda.render_module(groups)
    runners = "".join(_grid_runner(module.text, plan.function) for plans in module.launches.values() for plan in plans)
    source = build_dir / "kernels.cc"
    source.write_text(_SHIM + module.text + "\n" + runners)
    library = build_dir / "kernels.so"
    build = subprocess.run([CXX, "-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC", str(source), "-o",
                            str(library), "-lm"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    lib = ctypes.CDLL(str(library))
    return {key: _HostLauncher(group, [_HostFunction(lib, part, plan.function)
                                       for part, plan in zip(group.parts, module.launches[key])], module.launches[key])
            for key, group in groups.items()}


# ---- both targets at once ------------------------------------------------------------------------------

def assert_agree(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


class BothTargets:
    """One kernel on CUDA code and on numba: same arguments, results compared, CUDA's kept."""

    def __init__(self, name: str, cuda_launcher, cpu_launcher, to_device, to_host):
        self.name, self.cuda, self.cpu = name, cuda_launcher, cpu_launcher
        self.to_device, self.to_host = to_device, to_host
        self.group, self.functions = cuda_launcher.group, cuda_launcher.functions

    def __call__(self, *values):
        cpu_copies: dict[int, np.ndarray] = {}
        device: dict[int, object] = {}  # by id: an array passed twice stays one array
        for v in values:
            if isinstance(v, np.ndarray) and id(v) not in device:
                cpu_copies[id(v)] = v.copy()
                device[id(v)] = self.to_device(v)
        self.cpu(*(cpu_copies.get(id(v), v) for v in values))
        self.cuda(*(device.get(id(v), v) for v in values))
        for p, v in zip(self.cuda.params, values):
            if isinstance(p, ir.BufferParam) and p.writable:
                got = self.to_host(device[id(v)])
                assert_agree(got, cpu_copies[id(v)], f"{self.name}: '{p.name}' differs between cuda and cpu")
                np.copyto(v, got)


def both_targets(request, tmp_path_factory, checked, cpu_cache: dict):
    """name -> BothTargets for every kernel of `checked`, on the tier `request.param`."""
    groups = kernel_groups(checked)
    if request.param == "gpu":
        status = run_cuda.available()
        if not status:
            pytest.skip(status.reason)
        import cupy

        launchers = run_cuda.compile_kernels(groups)
        to_device, to_host = cupy.asarray, cupy.asnumpy
    else:
        if CXX is None:
            pytest.skip("no host C++ compiler (g++) to build the CUDA text for the host")
        launchers = compile_on_host(groups, tmp_path_factory.mktemp("cuda-host"))
        to_device, to_host = np.copy, lambda a: a

    def get(name: str) -> BothTargets:
        if name not in cpu_cache:
            cpu_cache[name] = compile_kernels({name: groups[name]})[name]
        return BothTargets(name, launchers[name], cpu_cache[name], to_device, to_host)

    return get


_CPU_MOTIFS: dict = {}
_CPU_SEMANTICS: dict = {}


@pytest.fixture(scope="module", params=TIERS)
def kernel(request, tmp_path_factory, motifs):
    """Overrides the CPU `kernel` fixture for the motif tests imported above."""
    return both_targets(request, tmp_path_factory, motifs, _CPU_MOTIFS)


@pytest.fixture(scope="module", params=TIERS)
def k(request, tmp_path_factory):
    """Overrides the `k` fixture of the imported scalar-semantics tests."""
    checked = load_files([test_scalar_semantics.FIXTURE])
    assert checked.ok, checked.diagnostics
    return both_targets(request, tmp_path_factory, checked, _CPU_SEMANTICS)


# ---- launch geometry ----------------------------------------------------------------------------------

def test_grid_stride_covers_more_lanes_than_threads(kernel, rng):
    """Two blocks of 256 threads for 7000 lanes: each thread strides through ~14 of them."""
    both = kernel("residual_add")
    both.cuda = copy.copy(both.cuda)
    both.cuda.plans = tuple(dataclasses.replace(p, max_blocks=2) for p in both.cuda.plans)
    x, r = rng.standard_normal((7, 1000)).astype(np.float32), rng.standard_normal((7, 1000)).astype(np.float32)
    want = x + r
    both(x, r)
    assert both.cuda.plans[0].grid_blocks({"T": 7, "D": 1000}) == 2
    np.testing.assert_array_equal(x, want)

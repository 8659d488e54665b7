"""The machine a benchmark ran on: CPU model and the SIMD flags that decide which kernels LLVM emits.

Every benchmark prints `describe()` with its figures, because the same kernel can be 2-3x
apart on an AVX2-only and an AVX-512 machine of the same size.
"""

from __future__ import annotations

import os
import platform

SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx_vnni", "avx512_bf16", "amx_tile")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def simd_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in SIMD_FLAGS if flag in present]
    except OSError:
        pass
    return []


def simd_class() -> str:
    flags = simd_flags()
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "pre-AVX2"


def describe() -> str:
    """One line: CPU model, SIMD class and flags, core count, numba's threading layer (TBB's
    launches cost 2-10 us against OpenMP's 1-2: loomc/lower/numba_threads.py) and any numba
    CPU override."""
    import numba

    from loomc.lower.numba_threads import use_openmp

    use_openmp()
    try:
        layer = numba.threading_layer()
    except ValueError:   # no parallel launch in this process yet: the one it would pick
        layer = "the first to load of " + " ".join(numba.config.THREADING_LAYER_PRIORITY)
    override = os.environ.get("NUMBA_CPU_NAME")
    line = f"{cpu_model()}; {simd_class()} ({' '.join(simd_flags())}); {os.cpu_count()} cores; threading layer {layer}"
    return line + (f"; numba targets {override} (NUMBA_CPU_NAME)" if override else "")

"""The cpu target's threading layer: OpenMP, launched from one thread; TBB where libgomp is missing.

numba picks its layer once, at the first parallel launch, from THREADING_LAYER_PRIORITY.
`use_openmp` puts OpenMP first. Its team spins between parallel loops, so a launch costs
1-2 us where TBB's, which opens a task arena for every loop, costs 2-10 us: on the 2-core Zen 5
VM a batch-1 decode step of scout took 2.1 ms against 3.0-3.2 ms (docs/performance.md). OpenMP
gives each launching thread a team of its own, and more teams than cores stop the spinning
(25-50 us a launch), so every launch runs on one thread (`loomc.run.kernel_thread`).

TBB stays the fallback for a machine without libgomp. pip's `tbb` (a dependency) installs
libtbb.so.12 into `<prefix>/lib`, where the dynamic loader does not look, and numba's TBB pool
links to it by soname: `use_tbb` loads it by path first, so numba can fall back to it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import logging
import os
from pathlib import Path

LOG = logging.getLogger(__name__)
PRIORITY = "omp tbb workqueue"   # numba's NUMBA_THREADING_LAYER_PRIORITY, unless the environment sets it
LIBRARY = "libtbb.so.12"   # the soname numba's tbbpool module needs


def library_path() -> Path | None:
    """Where the `tbb` distribution put libtbb.so.12, or None when it is not installed."""
    try:
        files = importlib.metadata.files("tbb") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == LIBRARY:
            path = Path(f.locate()).resolve()
            if path.exists():
                return path
    return None


@functools.cache
def use_tbb() -> bool:
    """Make TBB loadable for numba (before its first parallel launch); False if it cannot be."""
    path = library_path()
    if path is None:
        LOG.info("loomc: the `tbb` package is not installed; "
                 "without libgomp numba falls back to its workqueue")
        return False
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        LOG.info("loomc: could not load %s (%s); without libgomp numba falls back to its workqueue", path, e)
        return False
    return True


@functools.cache
def use_openmp() -> None:
    """Make OpenMP the layer numba picks first, then TBB, and load it on the kernel thread
    (`loomc.run.kernel_thread`), before any parallel kernel is compiled or launched.
    NUMBA_THREADING_LAYER or NUMBA_THREADING_LAYER_PRIORITY in the environment still decide.

    When the team takes every CPU the process may run on, its threads are bound one to a CPU
    (OMP_PROC_BIND, unless the environment sets it). Unbound, a worker woken after an idle
    spell was often put on its master's CPU, and the two then took turns by the scheduler's
    tick while the master spun at the barrier: an empty parallel loop took 4-8 ms instead of
    50-120 us on the 2-core VM. libgomp binds the thread that loads it, hence the kernel thread.
    With fewer threads than CPUs (replicas sharing a machine) nothing is bound, since every
    process would bind its team to the same first CPUs."""
    import numba

    # numba reloads its config from the environment, so the order goes there too
    os.environ.setdefault("NUMBA_THREADING_LAYER_PRIORITY", PRIORITY)
    numba.config.THREADING_LAYER_PRIORITY = os.environ["NUMBA_THREADING_LAYER_PRIORITY"].split()
    threads = numba.config.NUMBA_NUM_THREADS
    # numba's default count is the calling thread's CPUs, and it reloads its config in whichever
    # thread compiles: on the bound kernel thread that would be 1, a change it refuses
    os.environ.setdefault("NUMBA_NUM_THREADS", str(threads))
    if threads > 1 and threads == len(os.sched_getaffinity(0)):
        os.environ.setdefault("OMP_PROC_BIND", "true")   # read once, when libgomp loads
    use_tbb()
    from numba.np.ufunc.parallel import _launch_threads

    from loomc.run.kernel_thread import on_kernel_thread

    on_kernel_thread(_launch_threads)

"""The cpu target's threading layer: TBB, one worker pool shared by every thread that launches.

A server launches kernels from several threads (one batching service per modality, the
registry's build worker). numba's OpenMP layer makes each launching thread the master of a
team of its own; once libgomp manages more threads than there are cores, it stops spinning
between parallel regions, and every launch then waits for its workers to be woken. Measured
on a 2-core VM: a small matmul launch costs about 10 us from the first launching thread and
120-160 us from any other, so an illustrator image (about 2,000 launches on the service's
thread) took 0.49 s instead of 0.33 s. TBB shares one pool among all launching threads (and
is fork safe).

pip's `tbb` (a dependency) installs libtbb.so.12 into `<prefix>/lib`, where the dynamic
loader does not look, and numba's TBB pool links to it by soname: `use_tbb` loads it by path
first, so numba's default layer order (tbb, omp, workqueue) finds it. Without it numba falls
back to OpenMP, with a warning here.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import logging
from pathlib import Path

LOG = logging.getLogger(__name__)
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
    """Make TBB the layer numba picks (before its first parallel launch); False if it cannot."""
    path = library_path()
    if path is None:
        LOG.warning("loomc: the `tbb` package is not installed; numba falls back to OpenMP, whose launches "
                    "from more than one thread are slow (pip install tbb)")
        return False
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        LOG.warning("loomc: could not load %s (%s); numba falls back to OpenMP", path, e)
        return False
    return True


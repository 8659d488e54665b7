"""loomrt: the Loom runtime (devices, checkpoints, control VM, registrations, services).

OpenBLAS's worker threads busy-wait after each call and starve numba's parallel kernels on
the same cores (measured: a BERT pass took 1.4 s with default BLAS threads, 48 ms with one).
Kernels parallelise themselves; BLAS gets one thread unless the operator says otherwise.
This only takes effect when loomrt is imported before numpy loads BLAS.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

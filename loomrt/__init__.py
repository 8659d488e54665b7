"""loomrt: the Loom runtime (devices, checkpoints, control VM, registrations, services).

Kernels (the `matmul` motif included) never call BLAS, but numpy's OpenBLAS may still run
in the same process (an application's own numpy linear algebra), and its worker threads
busy-wait after each call, starving numba's parallel kernels on the same cores (measured
when the motif was BLAS: a BERT pass took 1.4 s with default BLAS threads, 48 ms with one).
So BLAS gets one thread unless the operator says otherwise; this only takes effect when
loomrt is imported before numpy loads BLAS.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

"""The cpu target runs its parallel kernels on TBB, whichever thread launches them."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_kernels_launched_from_several_threads_run_on_tbb():
    # A fresh interpreter: numba chooses its threading layer once, at the first parallel launch.
    script = textwrap.dedent("""
        import threading
        import numba
        import numpy as np
        from loomc.lower import matmul, numba_threads
        assert numba_threads.library_path() is not None, "the tbb package is not installed"
        product = matmul.load_function("matmul")
        a, b = np.ones((1, 40, 8), np.float32), np.ones((1, 24, 8), np.float32)
        results = []
        def launch():
            c = np.zeros((1, 40, 24), np.float32)
            product(a, b, c, np.zeros(matmul.workspace_elems("matmul", 1, 40, 8, 24), np.float32))
            results.append(float(c.sum()))
        launch()
        worker = threading.Thread(target=launch)
        worker.start()
        worker.join()
        print(numba.threading_layer(), results)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    layer, _, results = done.stdout.strip().partition(" ")
    assert layer == "tbb"
    assert results == str([40 * 24 * 8.0] * 2)

"""The cpu target runs its parallel kernels on OpenMP, every launch from one thread."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from loomc.run.kernel_thread import kernel_thread_ident, on_kernel_thread


def test_stage_calls_from_several_threads_run_on_openmp_from_the_kernel_thread():
    # A fresh interpreter: numba chooses its threading layer once, at the first parallel launch.
    script = textwrap.dedent("""
        import threading
        import numba
        import numpy as np
        from loomc.lower import matmul
        from loomc.run.kernel_thread import kernel_thread_ident, on_kernel_thread
        product = matmul.load_function("matmul")
        a, b = np.ones((1, 40, 8), np.float32), np.ones((1, 24, 8), np.float32)
        results, threads = [], []
        def launch():
            c = np.zeros((1, 40, 24), np.float32)
            def call():
                threads.append(threading.get_ident())
                product(a, b, c, np.zeros(matmul.workspace_elems("matmul", 1, 40, 8, 24), np.float32))
            on_kernel_thread(call)
            results.append(float(c.sum()))
        launch()
        worker = threading.Thread(target=launch)
        worker.start()
        worker.join()
        assert threads == [kernel_thread_ident()] * 2 and threading.get_ident() not in threads, threads
        print(numba.threading_layer(), results)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    layer, _, results = done.stdout.strip().partition(" ")
    assert layer == "omp"
    assert results == str([40 * 24 * 8.0] * 2)


def test_the_kernel_thread_runs_calls_in_turn_and_hands_back_results_and_errors():
    seen: list[int] = []

    def where(tag: str) -> str:
        seen.append(threading.get_ident())
        return tag

    answers: list[str] = []
    callers = [threading.Thread(target=lambda i=i: answers.append(on_kernel_thread(where, f"call {i}"))) for i in range(4)]
    for t in callers:
        t.start()
    answers.append(on_kernel_thread(where, "main"))
    for t in callers:
        t.join()
    assert sorted(answers) == ["call 0", "call 1", "call 2", "call 3", "main"]
    assert set(seen) == {kernel_thread_ident()} and threading.get_ident() not in seen

    def fails() -> None:
        raise KeyError("no such tensor")

    with pytest.raises(KeyError, match="no such tensor"):
        on_kernel_thread(fails)
    # a call made on the kernel thread runs inline instead of waiting for itself
    assert on_kernel_thread(lambda: on_kernel_thread(where, "nested")) == "nested"
    assert on_kernel_thread(where, "after") == "after"   # the thread still serves


def test_a_team_that_takes_every_cpu_is_bound_one_thread_to_a_cpu():
    # unbound, a worker woken after an idle spell could land on its master's CPU (4-8 ms a launch);
    # a team smaller than the CPUs stays unbound, or processes sharing a machine would pile up
    cpus = len(os.sched_getaffinity(0))
    script = ("import os, loomc.lower.numba\n"
              "from loomc.run.kernel_thread import on_kernel_thread\n"
              "print(os.environ.get('OMP_PROC_BIND'), len(on_kernel_thread(lambda: os.sched_getaffinity(0))))\n")
    for threads in sorted({1, cpus}):
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_PROC_BIND", "NUMBA_THREADING_LAYER")}
        env["NUMBA_NUM_THREADS"] = str(threads)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr
        bind, kernel_cpus = done.stdout.split()
        if threads > 1:
            assert (bind, kernel_cpus) == ("true", "1")
        else:
            assert (bind, kernel_cpus) == ("None", str(cpus))

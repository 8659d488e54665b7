"""Executors of what loomc compiles: the control VM, kernel launchers and command programs.

    vm.py        the control VM (`fn` policies and `check` blocks) and host.py, its host imports
    launch.py    a lowered kernel launched on numpy arrays (storage layout, argument checks)
    dispatch.py  a command program: one stage call's dispatches over params, state and inputs
    cuda.py      the CUDA target's launchers (CuPy; imports without a GPU)
    compile.py   lowered plans and kernels -> runnable programs for a target
    errors.py    the errors they raise (`RunError`); loomrt maps them to HTTP-level errors

They live with the compiler so that `loomc test` runs without the runtime; nothing here
imports `loomrt` or `loomd`.
"""

"""A reference engine in a child process of its own, called method by method.

Why not in the benchmark's process: a reference built on OpenMP (torch's CPU build, llama.cpp)
loads `libgomp.so.1`, and numba's `omp` threading layer then uses that same runtime. With two
launching threads (the reference's, Loom's kernel thread) libgomp manages more threads than
there are cores and stops spinning between parallel regions, and every launch waits for its
workers to wake: Loom's embeddings at batch 32 ran at half speed next to torch (547-564
against 1063 /s), and decode at 21 against 68 tok/s after llama.cpp had run once.
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Callable


def _serve(conn: Any, factory: Callable[..., Any], args: tuple) -> None:
    try:
        engine = factory(*args)
    except ImportError as exc:   # the reference is not installed: the parent raises it
        conn.send(exc)
        return
    conn.send("ready")
    while True:
        request = conn.recv()
        if request is None:
            return
        method, method_args = request
        conn.send(getattr(engine, method)(*method_args))


class InChild:
    """`factory(*args)` built and called in a spawned child; `call(method, ...)` returns what the
    engine's method returned (pickled back). A factory must be importable by name: a module-level
    class of the benchmark script is."""

    def __init__(self, factory: Callable[..., Any], *args: Any):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, factory, args), daemon=True)
        self.process.start()
        answer = self.conn.recv()
        if isinstance(answer, ImportError):
            self.process.join()
            raise answer

    def call(self, method: str, *args: Any) -> Any:
        self.conn.send((method, args))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(30)


__all__ = ["InChild"]

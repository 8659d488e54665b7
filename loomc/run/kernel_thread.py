"""The one thread that launches the process's cpu kernels.

numba's threading layers differ in what a parallel loop costs to open, and it is paid about
140 times a decode step of scout (its projections and attention):

* TBB opens a task arena for every parallel loop. On the 2-core Zen 5 VM an empty loop took
  2 us back to back, 6.5 us right after a loop the worker thread took part in, and 8-10 us
  after 20 us or more of serial work. A batch-1 step took 3.0-3.2 ms.
* OpenMP keeps a team per launching thread whose workers spin between loops: 1.2-2.4 us
  whatever came before, and a batch-1 step of 2.1 ms (docs/performance.md). But once libgomp
  manages more threads than the machine has cores (a second launching thread is enough on 2
  cores), its workers stop spinning, and a launch from either thread took 25-50 us.

So the cpu target runs on OpenMP (`loomc.lower.numba_threads`), and every launch the
runtime makes, a stage call of a command program or a kernel launcher's, runs on this one
thread: from it, inline; from any other thread (a service's, a registration's), handed over
and waited for, 19-43 us a hand-off there and back. Calls run one at a time, in the order they
arrive. A kernel holds the GIL while it runs, so the services were already taking turns.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_calls: queue.SimpleQueue | None = None
_ident: int | None = None


class _Call:
    """One hand-off. The caller waits on `done`, a lock the kernel thread releases: one wake each
    way. concurrent.futures.Future's condition cost 3-6 us more a step at batch 1 and 22 us
    more at 8 rows (in and out: 64 -> 42 us)."""

    __slots__ = ("fn", "args", "result", "error", "done")

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args, self.result, self.error = fn, args, None, None
        self.done = threading.Lock()
        self.done.acquire()


def _serve(calls: queue.SimpleQueue) -> None:
    while True:
        call = calls.get()
        try:
            call.result = call.fn(*call.args)
        except BaseException as exc:  # noqa: BLE001 - the caller's to handle, on its own thread
            call.error = exc
        finally:
            call.fn = call.args = None   # nothing of a finished call stays referenced while the thread waits
            call.done.release()
            del call


def _start() -> queue.SimpleQueue:
    global _calls, _ident
    with _lock:
        if _calls is None:
            calls: queue.SimpleQueue = queue.SimpleQueue()
            started = threading.Event()

            def main() -> None:
                global _ident
                _ident = threading.get_ident()
                started.set()
                _serve(calls)

            threading.Thread(target=main, name="loom-kernels", daemon=True).start()
            started.wait()
            _calls = calls
        return _calls


def on_kernel_thread(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on the kernel thread: its result, or its exception raised here."""
    if threading.get_ident() == _ident:
        return fn(*args)
    calls = _calls if _calls is not None else _start()
    call = _Call(fn, args)
    calls.put(call)
    call.done.acquire()
    if call.error is not None:
        raise call.error
    return call.result


def kernel_thread_ident() -> int | None:
    """The kernel thread's identity (None before the first hand-off)."""
    return _ident


def _forget_after_fork() -> None:
    # a forked child has no kernel thread: the first hand-off there starts one
    global _calls, _ident, _lock
    _calls, _ident, _lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)

__all__ = ["kernel_thread_ident", "on_kernel_thread"]

"""Compile a deployment's kernels before their first launch, counting them as they finish.

numba compiles a dispatcher on its first call. Left alone, a cold cache makes a model
"ready" in seconds and then spends half a minute compiling inside its first request, with
nothing to show for it. Compiling every kernel a program dispatches (and every `compute`
kernel its preparation runs) ahead, at registration, makes "ready" mean ready and gives a
count to report: kernels compiled of total.

Each part is compiled for the exact argument types its launch passes (`argument_examples`
of the launcher or motif), so the first launch finds the compiled overload instead of
compiling another. With a warm disk cache, compiling is loading the cached machine code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from loomc.run.launch import KernelLauncher

#: Told (compiled, total) before the first kernel and after each one.
Progress = Callable[[int, int], None]


def ahead_of_time_units(programs: Mapping[str, Any], launchers: Iterable[KernelLauncher] = ()) -> list[tuple[Any, tuple]]:
    """(dispatcher, argument examples) for every distinct compiled function that `programs`
    (command programs: their kernel launchers and motifs) and `launchers` launch."""
    from loomc.lower.motifs import lowering_of

    units: dict[int, tuple[Any, tuple]] = {}

    def add_launcher(launcher: KernelLauncher) -> None:
        examples = launcher.argument_examples()
        for function in launcher.functions:
            units.setdefault(id(function), (function, examples))

    for program in programs.values():
        for name, launcher in program.launchers.items():
            if isinstance(launcher, KernelLauncher):
                add_launcher(launcher)
            else:  # a motif's dispatcher, keyed by the motif's name
                units.setdefault(id(launcher), (launcher, lowering_of(name).argument_examples(name)))
    for launcher in launchers:
        add_launcher(launcher)
    return list(units.values())


def compile_ahead(units: list[tuple[Any, tuple]], progress: Progress | None = None) -> None:
    """Compile each unit for its examples' types (numba loads it from the disk cache when it is
    there), telling `progress` the count after each."""
    from numba import typeof

    total = len(units)
    if progress is not None:
        progress(0, total)
    for done, (function, examples) in enumerate(units, 1):
        function.compile(tuple(typeof(v) for v in examples))
        if progress is not None:
            progress(done, total)


__all__ = ["Progress", "ahead_of_time_units", "compile_ahead"]

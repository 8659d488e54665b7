"""The compiler's intrinsic motifs by name: the lowering module that generates each one."""

from __future__ import annotations

from types import ModuleType


def lowering_of(motif: str) -> ModuleType:
    """loomc/lower/conv3x3.py for `conv3x3`, loomc/lower/matmul.py for the matmul family: each
    has `load_function(motif, cache_dir)` and `argument_examples(motif)`."""
    from loomc.lower import conv3x3, matmul

    return conv3x3 if motif in conv3x3.MOTIFS else matmul

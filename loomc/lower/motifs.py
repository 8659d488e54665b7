"""The compiler's intrinsic motifs by name: the lowering module that generates each one."""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType


@lru_cache(maxsize=None)
def lowering_of(motif: str) -> ModuleType:
    """loomc/lower/conv3x3.py for `conv3x3`, loomc/lower/attention.py for `attention`,
    loomc/lower/paged_attention.py for `attention_paged`,
    loomc/lower/qdot.py for the integer-dot matmuls over quantized weights,
    loomc/lower/i8gemm.py for `matmul_i8` (int8 weights, activations quantized per row),
    loomc/lower/matmul.py for the f32/f16 matmul family: each
    has `load_function(motif, cache_dir)`, `argument_examples(motif)`, and for dispatch
    `workspace_for(motif, tensor_dims, scalars)` and `launch_arguments(motif, values, workspace)`."""
    from loomc.lower import attention, conv3x3, i8gemm, matmul, paged_attention, qdot

    for module in (conv3x3, attention, paged_attention, qdot, i8gemm):
        if motif in module.MOTIFS:
            return module
    return matmul

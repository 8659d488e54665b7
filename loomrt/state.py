"""Retained state: the arrays a deployment's `state` declarations ask the host to keep.

Each declaration has a host dimension by scope: `per row` is sized by the document's
`rows` (1 for kinds without rows), `per request` likewise (requests in a step never exceed
the rows), and `per page` by the shared pool: `pool_capacity` positions in pages of the
control program's `config page_size` positions (a pooled state without that config fails
the registration, naming what is missing). The arrays are zeroed once here and charged
to the device ledger as `state`. The layout comes from the `CompiledModule`'s state table.
"""

from __future__ import annotations

import math

import numpy as np

from loomc.module import CompiledModule
from loomc.run.launch import allocate
from loomrt.document import ModelDocument
from loomrt.errors import CompileError

PAGE_SIZE_CONFIG = "page_size"
DEFAULT_POOL_POSITIONS = 8192   # KV positions of a deployment whose document sizes no pool (decision)


def page_size(module: CompiledModule) -> int | None:
    """The control program's `config page_size`, when it declares a valid one."""
    value = module.config(PAGE_SIZE_CONFIG)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def host_sizes(module: CompiledModule, doc: ModelDocument) -> dict[str, int]:
    """How many rows, pages and requests the host allocates state for, by scope."""
    rows = doc.rows or 1
    sizes = {"row": rows, "request": rows}
    if any(spec.scope == "page" for spec in module.states.values()):
        size = page_size(module)
        if size is None:
            raise CompileError(f"model '{doc.model}' keeps `per page` state, so its control program must declare "
                               f"`config {PAGE_SIZE_CONFIG}: i64` (positions per page), a positive integer")
        sizes["page"] = math.ceil((doc.pool_capacity or DEFAULT_POOL_POSITIONS) / size)
    return sizes


def allocate_state(module: CompiledModule, doc: ModelDocument) -> dict[str, np.ndarray]:
    """The deployment's state arrays, zeroed and written once. `np.zeros` maps pages that are
    backed by memory only when first written, so without the write RSS would grow for as long
    as requests reach KV pages never used before (up to the whole pool, which `/v1/status`
    charges as `state` from preparation on): a soak reads that as a leak, and a machine short
    of memory would fail mid-request instead of at preparation."""
    sizes = host_sizes(module, doc)
    state = {name: allocate(spec.dtype, [sizes[spec.scope], *spec.dims]) for name, spec in module.states.items()}
    for array in state.values():
        array.fill(0)
    return state


def state_bytes(state: dict[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in state.values())


__all__ = ["DEFAULT_POOL_POSITIONS", "PAGE_SIZE_CONFIG", "allocate_state", "host_sizes", "page_size", "state_bytes"]

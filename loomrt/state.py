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
import mmap

import numpy as np

from loomc.module import CompiledModule
from loomc.run.launch import HOST_STORAGE, storage_shape
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
    """The deployment's state arrays, zeroed and resident from the start. `np.zeros` maps
    pages that are backed by memory only when first written, so RSS would grow for as long as
    requests reach KV pages never used before (up to the whole pool, which `/v1/status`
    charges as `state` from preparation on): a soak reads that as a leak, and a machine short
    of memory would fail mid-request instead of at preparation."""
    sizes = host_sizes(module, doc)
    return {name: resident_zeros(spec.dtype, [sizes[spec.scope], *spec.dims]) for name, spec in module.states.items()}


#: Below this, populating a mapping saves nothing worth a system call.
POPULATE_BYTES = 1 << 20


def resident_zeros(dtype: str, dims: list[int]) -> np.ndarray:
    """A zeroed state array whose pages are all backed by memory now. Large ones are an
    anonymous mapping the kernel populates in one call (`MAP_POPULATE`: 425 MB of scout's
    pool in about 0.25 s, where writing every page of `np.zeros` took 2 s in a fresh process,
    most of a warm restart); elsewhere (small arrays, systems without the flag) `np.zeros`
    written once."""
    shape, kind = storage_shape(dtype, dims), np.dtype(HOST_STORAGE[dtype])
    nbytes = math.prod(shape) * kind.itemsize
    flag = getattr(mmap, "MAP_POPULATE", None)
    if nbytes < POPULATE_BYTES or flag is None:
        array = np.zeros(shape, kind)
        array.fill(0)
        return array
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flag)
    return np.frombuffer(mapping, kind).reshape(shape)   # the array keeps the mapping alive


def state_bytes(state: dict[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in state.values())


__all__ = ["DEFAULT_POOL_POSITIONS", "PAGE_SIZE_CONFIG", "allocate_state", "host_sizes", "page_size", "state_bytes"]

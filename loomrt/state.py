"""Retained state: the arrays a deployment's `state` declarations ask the host to keep.

Each declaration has a host dimension by scope: `per row` is sized by the document's
`rows` (1 for kinds without rows), `per request` likewise (requests in a step never exceed
the rows), and `per page` by the shared pool: `pool_capacity` positions in pages of the
control program's `config page_size` positions (a pooled state without that config fails
the registration, naming what is missing). The arrays are zeroed once here and charged
to the device ledger as `state`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from loomc.syntax import ast
from loomrt.document import ModelDocument
from loomrt.errors import CompileError
from loomrt.launch import allocate

PAGE_SIZE_CONFIG = "page_size"


DEFAULT_POOL_POSITIONS = 8192   # KV positions of a deployment whose document sizes no pool (decision)


def config_constant(checked: Any, name: str) -> Any | None:
    """The folded value of `config NAME`: as the control program sees it, else as declared in
    any module of the program (a config module the control program does not import), or None."""
    for info in checked.roles.get("control", []):
        sym = info.scope.get(name)
        if sym is not None and isinstance(sym.item, ast.Config):
            return checked.core.config_value(sym)
    for info in checked.modules:
        sym = info.scope.get(name)
        if sym is not None and isinstance(sym.item, ast.Config) and sym.module is info:
            return checked.core.config_value(sym)
    return None


def host_sizes(executables: Any, doc: ModelDocument) -> dict[str, int]:
    """How many rows, pages and requests the host allocates state for."""
    rows = doc.rows or 1
    sizes = {"<rows>": rows, "<requests>": rows}
    scopes = {spec.dims[0].bare_symbol for p in executables.programs.values() for spec in p.plan.states.values()}
    if "<pages>" in scopes:
        page_size = config_constant(executables.checked, PAGE_SIZE_CONFIG)
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
            raise CompileError(f"model '{doc.model}' keeps `per page` state, so its control program must declare "
                               f"`config {PAGE_SIZE_CONFIG}: i64` (positions per page), a positive integer")
        sizes["<pages>"] = math.ceil((doc.pool_capacity or DEFAULT_POOL_POSITIONS) / page_size)
    return sizes


def allocate_state(executables: Any, doc: ModelDocument) -> dict[str, np.ndarray]:
    sizes = host_sizes(executables, doc)
    out: dict[str, np.ndarray] = {}
    for program in executables.programs.values():
        for name, spec in program.plan.states.items():
            if name not in out:
                dims = [sizes[spec.dims[0].bare_symbol]] + [int(d.constant) for d in spec.dims[1:]]
                out[name] = allocate(spec.dtype, dims)
    return out


def state_bytes(state: dict[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in state.values())


__all__ = ["PAGE_SIZE_CONFIG", "allocate_state", "config_constant", "host_sizes", "state_bytes"]

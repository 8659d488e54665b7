"""One batching service per modality, all on the `StageService` skeleton of `base.py`.

A kind's module here (`loomrt.services.<kind>`, e.g. `text.py`) may define
    create_policy(registration, executables, tokenizer) -> policy   at compile time (no weights)
    create_service(registration, component, residency, state, **common) -> StageService
and the registry uses them; a kind without a module is served by the plain `StageService`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from loomrt.document import KINDS


def service_module(kind: str) -> ModuleType | None:
    """The module that serves `kind`, or None when the generic service does."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    try:
        return importlib.import_module(f"loomrt.services.{kind}")
    except ModuleNotFoundError as exc:
        if exc.name == f"loomrt.services.{kind}":
            return None
        raise

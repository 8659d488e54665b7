"""One batching service per modality, all on the `StageService` skeleton of `base.py`.

A kind's module here (`loomrt.services.<kind>`, e.g. `text.py`) may define
    create_policy(registration, executables, tokenizer) -> policy   at compile time (no weights)
    create_service(registration, component, residency, state, **common) -> StageService
and the registry uses them; a kind without a module is served by the plain `StageService`.
The module names the stage its HTTP contract runs (`SERVICE_STAGE`): a deployment whose
program does not declare it is *native-only* (the spec's term): it registers and serves
stage jobs through the Python API on the plain `StageService`, has no `loom.endpoint`,
and HTTP inference requests to it are 404.
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


def service_stage(module: ModuleType | None) -> str | None:
    if module is None:
        return None
    for name in ("SERVICE_STAGE", "STEP_STAGE", "DECIDE_STAGE"):
        stage = getattr(module, name, None)
        if stage is not None:
            return stage
    return None


def serving_module(kind: str, stages: set[str]) -> ModuleType | None:
    """The kind's module when the program declares the kind's stage, else None (native-only)."""
    module = service_module(kind)
    stage = service_stage(module)
    return module if module is not None and (stage is None or stage in stages) else None

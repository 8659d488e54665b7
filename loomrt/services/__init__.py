"""One batching service per modality, all on the `StageService` skeleton of `base.py`.

Each kind's module here exports one typed `KindSpec`: the stages its HTTP contract runs,
the factories of its request policy (at compile time, no weights) and of its service, the
spec section (the `loomd.routes` module) that serves it, and the state scopes its service
retains. Registration looks the kind up in `KINDS` and nowhere else. A deployment whose
program does not declare every stage of its kind is *native-only* (the spec's term): it
registers and serves stage jobs through the Python API on the plain `StageService`, has no
HTTP endpoint of its kind, and HTTP inference requests to it are 404. 
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loomrt.document import KINDS as DOCUMENT_KINDS


@dataclass(frozen=True)
class KindSpec:
    kind: str
    stages: tuple[str, ...]          # all declared: the kind's service and endpoint; else native-only
    create_policy: Callable[..., Any]    # (registration, executables, tokenizer) -> policy
    create_service: Callable[..., Any]   # (registration, component, residency, state, **common) -> service
    route: str                       # the loomd.routes module (spec section) of its endpoint
    state_scopes: tuple[str, ...] = ("page",)   # the `state` scopes its service knows how to retain

    def serves(self, stages: set[str]) -> bool:
        return all(stage in stages for stage in self.stages)


_MODULES = {"text": "text", "embedding": "embedding", "decision": "decision", "sequence": "sequence",
            "recognition": "recognition", "speech": "speech", "image": "image"}


def kind_spec(kind: str) -> KindSpec | None:
    """The spec of `kind`, or None when no service module serves it yet."""
    if kind not in DOCUMENT_KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    module = _MODULES.get(kind)
    return None if module is None else importlib.import_module(f"loomrt.services.{module}").KIND


def serving_spec(kind: str, stages: set[str]) -> KindSpec | None:
    """The kind's spec when the program declares every stage of it, else None (native-only)."""
    spec = kind_spec(kind)
    return spec if spec is not None and spec.serves(stages) else None


__all__ = ["KindSpec", "kind_spec", "serving_spec"]

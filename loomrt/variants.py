"""Native executable variants: a registration's inventory of compiled provider sets.

The spec's section "Native executable variants" in data: every registration that enables
the capability (`variant_capacity` > 0) starts with one ready variant, its document's own
sources, selected. Staging compiles a complete new provider set on a worker thread and
checks it against the base's `Contract` (stage declarations, parameter placement, state
layout); it never changes the selection. IDs come from one process-wide counter and are
never reused, whatever registrations come and go. The service switches to a selected
variant at its safe boundary; the selected variant counts that consumer in `users`.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from loomrt.errors import CompileError, LoomError

PAGE_SIZE = 64
_ids = itertools.count(1)
_ids_lock = threading.Lock()


def next_variant_id() -> int:
    with _ids_lock:
        return next(_ids)


@dataclass
class Variant:
    id: int
    base: int | None
    phase: str                                # compiling | ready | failed
    sources: tuple[str, ...]
    created: float = field(default_factory=time.time)
    users: int = 0
    error: LoomError | None = None
    executables: Any = None
    diagnostics: list[str] = field(default_factory=list)
    done: Future = field(default_factory=Future)  # resolves with the record when terminal

    def record(self, detailed: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"object": "variant", "id": self.id, "base": self.base, "phase": self.phase,
                               "users": self.users, "created": int(self.created)}
        if self.error is not None:
            out["error"] = {"code": self.error.code, "message": self.error.message}
        if detailed:
            out["sources"] = list(self.sources)
            out["diagnostics"] = list(self.diagnostics)
            if self.executables is not None:
                out["stages"] = {name: p.num_dispatches for name, p in self.executables.programs.items()}
        return out

    def finish(self, executables: Any = None, error: LoomError | None = None) -> None:
        self.executables, self.error = executables, error
        self.phase = "failed" if error is not None else "ready"
        if isinstance(error, CompileError):
            self.diagnostics = error.rendered() or [error.message]
        elif error is not None:
            self.diagnostics = [error.message]
        self.done.set_result(self)


class VariantTable:
    """One registration's variants, in creation order. Callers hold the registry lock."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.records: dict[int, Variant] = {}
        self.selected: int | None = None
        self.selecting: int | None = None     # a selection waiting for the service's boundary

    def add(self, variant: Variant) -> None:
        self.records[variant.id] = variant

    def summary(self) -> dict[str, int | None]:
        return {"selected": self.selected, "count": len(self.records)}

    def page(self, offset: int) -> tuple[list[dict[str, Any]], int | None]:
        items = list(self.records.values())
        chunk = items[offset:offset + PAGE_SIZE]
        following = offset + PAGE_SIZE
        return [v.record() for v in chunk], (following if following < len(items) else None)


__all__ = ["PAGE_SIZE", "Variant", "VariantTable", "next_variant_id"]

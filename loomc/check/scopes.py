"""Lexical scopes for local names inside kernel, command and control bodies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Local:
    type: Any
    mutable: bool
    kind: str  # "let", "var", "arg", "out", "symbol", "loop", "scratch", "result"
    value: Any = None  # folded value for compile-time loop variables in commands


@dataclass
class Scopes:
    frames: list[dict[str, Local]] = field(default_factory=lambda: [{}])

    def push(self) -> None:
        self.frames.append({})

    def pop(self) -> None:
        self.frames.pop()

    def declare(self, name: str, local: Local) -> Local | None:
        """Declare in the innermost frame; returns the existing local if the name is taken in any frame."""
        existing = self.get(name)
        self.frames[-1][name] = local
        return existing

    def get(self, name: str) -> Local | None:
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        return None

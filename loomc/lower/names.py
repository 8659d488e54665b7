"""Fresh variable names for the lowering passes that introduce names (kernels, commands, lanes, jam)."""

from __future__ import annotations


class FreshNames:
    """Hands out names not yet in `names` (`base`, `base_1`, ...) and records each one it gives."""

    def __init__(self, names: set[str] | None = None):
        self.names = names if names is not None else set()

    def fresh(self, base: str) -> str:
        candidate, n = base, 0
        while candidate in self.names:
            n += 1
            candidate = f"{base}_{n}"
        self.names.add(candidate)
        return candidate

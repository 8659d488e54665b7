"""Lines per source file, largest first, so growth shows up in review (reported, never gated)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOTS = ("loomc", "loomrt", "loomd")  # the grammar is loomc/grammar/loom.lark
SUFFIXES = (".py", ".lark", ".loom")


def main() -> int:
    repo = Path(__file__).resolve().parents[1]
    rows = []
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*")):
            if path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                rows.append((sum(1 for _ in path.open(encoding="utf-8")), path.relative_to(repo)))
    rows.sort(reverse=True)
    for count, path in rows:
        print(f"{count:6d}  {path}")
    print(f"{sum(c for c, _ in rows):6d}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())

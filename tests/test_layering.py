"""The packages import downward only: loomc never imports loomrt or loomd; loomrt never imports loomd,
nor the compiler's front end (`loomc.check`, `loomc.syntax`): it reads the `CompiledModule`.

Checked on the syntax tree of every module (every `import` and `from ... import`, at any
depth: a lazy import inside a function counts), not by grep, so neither a comment nor a
string can hide or fake one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# package -> modules (and everything under them) it must never import
FORBIDDEN = {"loomc": ("loomrt", "loomd"), "loomrt": ("loomd", "loomc.check", "loomc.syntax")}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package):
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        for line, module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN[package]):
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {module}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_lazy_imports(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from loomrt.errors import LoomError\n    import loomd.app\n")
    assert imported_modules(sample) == [(2, "loomrt.errors"), (3, "loomd.app")]

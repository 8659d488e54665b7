"""A checked program: every module reachable through explicit `use`, with per-module scopes.

Nothing leaks between files: a module sees its own items plus the names it
imports, and an import only finds items *declared* in the target module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loomc.bytecode import SUFFIX as BYTECODE_SUFFIX
from loomc.bytecode import LoomBytecodeError, read_bytecode_file, read_module
from loomc.bytecode.format import MAX_FILE_BYTES
from loomc.syntax import ast
from loomc.syntax.diagnostics import Diagnostic, LoomSyntaxError
from loomc.syntax.parse import parse_module
from loomc.syntax.printer import format_module

STD_PREFIX = "std:"
MOTIFS_DIR = Path(__file__).resolve().parents[1] / "motifs"
#: Where uploaded packages' members appear to the loader: `/loom-package/<namespace>/<member>`.
#: The prefix names no server directory; a path under it is read from its package or not at all.
PACKAGE_ROOT = Path("/loom-package")
#: The namespace of the package a request uploaded; its members display as their plain names.
UPLOAD = "upload"


def package_path(member: str, namespace: str = UPLOAD) -> Path:
    """The path under which package member `member` is loaded (`use` resolves relative to it)."""
    return PACKAGE_ROOT / namespace / member


class Reporter:
    """Collects diagnostics; the checker reports everything and sorts once at the end."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []
        self.sources: dict[str, str] = {}

    def error(self, path: str, span: ast.Span, code: str, message: str, notes: tuple[str, ...] = ()) -> None:
        self.diagnostics.append(Diagnostic(path, span.line, span.column, code, message,
                                           end_line=span.end_line, end_column=span.end_column, notes=notes))

    def add(self, diagnostic: Diagnostic) -> None:
        self.diagnostics.append(diagnostic)

    def sorted(self) -> list[Diagnostic]:
        unique = {(d.path, d.line, d.column, d.code, d.message): d for d in self.diagnostics}
        return sorted(unique.values(), key=lambda d: d.sort_key)


@dataclass
class Symbol:
    item: ast.Item
    module: "ModuleInfo"

    @property
    def kind(self) -> str:
        return type(self.item).__name__.lower()


@dataclass
class ModuleInfo:
    path: str  # display path
    key: str  # resolved absolute path
    module: ast.Module
    decls: dict[str, ast.Item] = field(default_factory=dict)
    scope: dict[str, Symbol] = field(default_factory=dict)
    checks: dict[str, ast.Check] = field(default_factory=dict)


def display_path(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def resolve_use(importer: Path, target: str) -> Path:
    if target.startswith(STD_PREFIX):
        return MOTIFS_DIR / target[len(STD_PREFIX):]
    return (importer.parent / target).resolve()


class Program:
    """`packages`, when given, maps a namespace to an uploaded package's members: paths under
    `PACKAGE_ROOT/<namespace>` read from it (a missing member is a missing file: nothing
    falls back to the disk), and a relative `use` cannot leave its package. Other paths are
    server-local files. A variant's candidate is checked with its own upload beside the
    registration's package, hence more than one namespace."""

    def __init__(self, reporter: Reporter, packages: "Mapping[str, Mapping[str, bytes]] | None" = None):
        self.reporter = reporter
        self.modules: dict[str, ModuleInfo] = {}
        self.packages = dict(packages or {})

    def _member(self, path: Path) -> tuple[str, str] | None:
        """(namespace, member) of a path under PACKAGE_ROOT, else None."""
        if not self.packages:
            return None
        normalized = Path(os.path.normpath(path))
        if not normalized.is_relative_to(PACKAGE_ROOT):
            return None
        parts = normalized.relative_to(PACKAGE_ROOT).parts
        if len(parts) < 2:
            return ("", "")
        return parts[0], "/".join(parts[1:])

    def _read(self, path: Path) -> bytes:
        member = self._member(path)
        if member is None:
            if path.suffix == BYTECODE_SUFFIX:
                return read_bytecode_file(path)
            return path.read_bytes()
        files = self.packages.get(member[0], {})
        if member[1] not in files:
            raise FileNotFoundError(2, f"{self._shown(path)} is not in the uploaded package")
        return bytes(files[member[1]])

    def _exists(self, path: Path) -> bool:
        member = self._member(path)
        return path.is_file() if member is None else member[1] in self.packages.get(member[0], {})

    def _key(self, path: Path) -> str:
        return os.path.normpath(path) if self._member(path) is not None else str(path.resolve())

    def _shown(self, path: Path) -> str:
        member = self._member(path)
        if member is None:
            return display_path(path)
        return member[1] if member[0] == UPLOAD else f"{member[0]}:{member[1]}"

    def load(self, path: Path) -> ModuleInfo | None:
        """Load a file and, transitively, everything it uses. Returns None if it did not parse."""
        key = self._key(path)
        if key in self.modules:
            return self.modules[key]
        shown = self._shown(path)
        module = self._read_bytecode(path, shown) if path.suffix == BYTECODE_SUFFIX else self._parse(path, shown)
        if module is None:
            return None
        info = ModuleInfo(shown, key, module)
        self.modules[key] = info
        self._declare(info)
        for item in module.items:
            if isinstance(item, ast.Use):
                self._import(info, Path(key), item)
        return info

    def _parse(self, path: Path, shown: str) -> ast.Module | None:
        try:
            text = self._read(path).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.reporter.add(Diagnostic(shown, 1, 1, "L0203", f"cannot read file: {exc.strerror or exc}"))
            return None
        self.reporter.sources[shown] = text
        try:
            return parse_module(text, shown)
        except LoomSyntaxError as exc:
            self.reporter.add(exc.diagnostic)
            return None

    def _read_bytecode(self, path: Path, shown: str) -> ast.Module | None:
        """A `.loombc` twin. Its spans are positions in its `dis` text, which is kept as the
        source so diagnostics show those lines; a corrupt file is one L0800 at 1:1."""
        try:
            data = self._read(path)
            if len(data) > MAX_FILE_BYTES:
                raise LoomBytecodeError(f"file is {len(data)} bytes; a .loombc holds at most {MAX_FILE_BYTES}",
                                        MAX_FILE_BYTES)
            module = read_module(data, shown)
        except OSError as exc:
            self.reporter.add(Diagnostic(shown, 1, 1, "L0203", f"cannot read file: {exc.strerror or exc}"))
            return None
        except LoomBytecodeError as exc:
            self.reporter.add(Diagnostic(shown, 1, 1, "L0800", str(exc)))
            return None
        self.reporter.sources[shown] = format_module(module)
        return module

    def _declare(self, info: ModuleInfo) -> None:
        for item in info.module.items:
            if isinstance(item, ast.Use):
                continue
            if isinstance(item, ast.Check):
                if item.name in info.checks:
                    self._duplicate(info, item.name, item.name_span, info.checks[item.name])
                else:
                    info.checks[item.name] = item
                continue
            if item.name in info.decls:
                self._duplicate(info, item.name, item.name_span, info.decls[item.name])
                continue
            info.decls[item.name] = item
            info.scope[item.name] = Symbol(item, info)

    def _duplicate(self, info: ModuleInfo, name: str, span: ast.Span, first) -> None:
        first_span = getattr(first, "name_span", first.span)
        self.reporter.error(info.path, span, "L0201", f"'{name}' is already defined at {first_span.line}:{first_span.column}")

    def _import(self, info: ModuleInfo, importer: Path, use: ast.Use) -> None:
        if self._member(importer) is not None and not use.path.startswith((STD_PREFIX, "/")):
            target_path = Path(os.path.normpath(importer.parent / use.path))
            member = self._member(target_path)
            if member is None or member[0] != self._member(importer)[0] or not member[1]:
                self.reporter.error(info.path, use.path_span, "L0203", f"\"{use.path}\" escapes the uploaded "
                                                                       "package's root")
                return
        else:
            target_path = resolve_use(importer, use.path)
        if not self._exists(target_path):
            self.reporter.error(info.path, use.path_span, "L0203", f"cannot find module \"{use.path}\"",
                                notes=(f"looked for {self._shown(target_path)}",))
            return
        target = self.load(target_path)
        if target is None:
            return
        for imp in use.imports:
            item = target.decls.get(imp.name)
            if item is None:
                self.reporter.error(info.path, imp.span, "L0202", f"\"{use.path}\" has no item named '{imp.name}'")
                continue
            local = imp.local_name
            if local in info.scope:
                existing = info.scope[local]
                where = getattr(existing.item, "name_span", existing.item.span)
                self.reporter.error(info.path, imp.span, "L0201",
                                    f"'{local}' is already defined at {where.line}:{where.column}")
                continue
            info.scope[local] = Symbol(item, target)

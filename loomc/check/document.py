"""`loomc check` on a model document: resolve its control, prepare and sources and check them together.

Only the fields that name code and specialization are read here (`control`,
`prepare`, `sources`, `config`, `components`); the runtime validates the whole
document. Relative code paths resolve against the document's directory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loomc import strict_json
from loomc.check import CheckedProgram, check_program, match_stages
from loomc.check import types as T
from loomc.check.program import Program, Reporter, display_path
from loomc.syntax import ast
from loomc.syntax.diagnostics import Diagnostic

CODE_FIELDS = ("control", "prepare", "sources")


def _position(text: str, key: str, after: int = 0) -> tuple[int, int]:
    """Line and column of `"key"` in the JSON text (the first occurrence after `after`)."""
    m = re.compile(r'"' + re.escape(key) + r'"\s*:').search(text, after)
    offset = m.start() if m else 0
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def check_document(path: Path) -> tuple[list[Diagnostic], dict[str, str]]:
    """Diagnostics and sources read, for `loomc check` on a model document."""
    checked = load_document(path)
    return checked.diagnostics, checked.sources


def load_document(path: Path) -> CheckedProgram:
    """Load and check the code a model document names, with its config overrides folded in."""
    reporter = Reporter()
    program = Program(reporter)

    def failed() -> CheckedProgram:
        return CheckedProgram(program, None, reporter.sorted(), reporter.sources)

    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reporter.add(Diagnostic(shown, 1, 1, "L0702", f"cannot read model document: {exc}"))
        return failed()
    reporter.sources[shown] = text

    def doc_error(key: str, code: str, message: str, after: int = 0) -> None:
        line, col = _position(text, key, after)
        reporter.add(Diagnostic(shown, line, col, code, message))

    try:
        doc = strict_json.loads(text)
    except strict_json.StrictJsonError as exc:
        if exc.lineno is not None:
            reporter.add(Diagnostic(shown, exc.lineno, exc.colno, "L0702", f"invalid JSON: {exc}"))
        else:
            reporter.add(Diagnostic(shown, 1, 1, "L0702", f"invalid model document: {exc}"))
        return failed()
    if not isinstance(doc, dict):
        reporter.add(Diagnostic(shown, 1, 1, "L0702", "a model document is a JSON object"))
        return failed()

    base = path.resolve().parent

    def load(key: str, value: Any, after: int = 0) -> list:
        names = value if key == "sources" else [value]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            doc_error(key, "L0702", f"'{key}' must be {'a list of paths' if key == 'sources' else 'a path'}", after)
            return []
        loaded = []
        for name in names:
            file = Path(name) if Path(name).is_absolute() else base / name
            if not file.is_file():
                doc_error(key, "L0702", f"'{key}': cannot find {name}", after)
                continue
            info = program.load(file)
            if info is not None:
                loaded.append(info)
        return loaded

    control = load("control", doc["control"]) if "control" in doc else []
    prepare = load("prepare", doc["prepare"]) if "prepare" in doc else []
    by_component = {"primary": list(prepare)}
    sources = load("sources", doc["sources"]) if "sources" in doc else []
    components = doc.get("components", {})
    for name, comp in (components.items() if isinstance(components, dict) else ()):
        if isinstance(comp, dict):
            offset = _offset(text, _position(text, name))
            if "prepare" in comp:
                by_component[name] = load("prepare", comp["prepare"], offset)
                prepare += by_component[name]
            if "sources" in comp:
                sources += load("sources", comp["sources"], offset)

    overrides = doc.get("config", {})
    if not isinstance(overrides, dict):
        doc_error("config", "L0701", "'config' must be an object of overrides")
        overrides = {}
    overrides = _check_overrides(program, overrides, text, doc_error)
    checked = _check_roles(program, reporter, control, prepare, sources, overrides, doc)
    if len(by_component) > 1:   # as load_roles: each component's params apart
        checked.roles.update({f"prepare.{name}": infos for name, infos in by_component.items()})
    return checked


def load_roles(origin: str, control: Path, prepare: Mapping[str, list[Path]], sources: list[Path],
               overrides: dict[str, Any], packages: Mapping[str, Mapping[str, bytes]] | None = None
               ) -> CheckedProgram:
    """Check the code a runtime model document names: the same program `load_document` builds,
    from paths already resolved (package members under `package_path`, one namespace per
    package in `packages`), with its config overrides. `prepare` maps each resident component
    (`primary`, `image`) to its prepare files: roles `prepare.<component>` keep them apart, and
    `prepare` lists them all. Override problems are reported at `origin`, the document's name."""
    reporter = Reporter()
    program = Program(reporter, packages)

    def load(paths: list[Path]) -> list:
        loaded = []
        for path in paths:
            if not program._exists(path):
                reporter.add(Diagnostic(origin, 1, 1, "L0702", f"cannot find {program._shown(path)}"))
                continue
            info = program.load(path)
            if info is not None:
                loaded.append(info)
        return loaded

    control_infos, source_infos = load([control]), load(sources)
    components = {name: load(paths) for name, paths in prepare.items()}
    prepare_infos = [info for infos in components.values() for info in infos]

    def doc_error(key: str, code: str, message: str, after: int = 0) -> None:
        reporter.add(Diagnostic(origin, 1, 1, code, message))

    valid = _check_overrides(program, dict(overrides), "", doc_error)
    checked = _check_roles(program, reporter, control_infos, prepare_infos, source_infos, valid, None)
    checked.roles.update({f"prepare.{name}": infos for name, infos in components.items()})
    return checked


def _check_roles(program: Program, reporter: Reporter, control: list, prepare: list, sources: list,
                 overrides: dict[str, Any], doc: dict[str, Any] | None) -> CheckedProgram:
    core = check_program(program, overrides)
    for info in sources:
        for item in info.module.items:
            if isinstance(item, ast.Stage):
                core.error(info, item.name_span, "L0606", f"stage '{item.name}' is declared in a source; stage "
                                                          "declarations belong to the control program",
                           notes=("variants replace sources, never stage declarations",))
    match_stages(core, control, sources, require_all=True)
    roles = {"control": control, "prepare": prepare, "sources": sources}
    return CheckedProgram(program, core, reporter.sorted(), reporter.sources, roles, doc)


def _offset(text: str, pos: tuple[int, int]) -> int:
    line, col = pos
    return sum(len(l) + 1 for l in text.split("\n")[: line - 1]) + col - 1


def _check_overrides(program: Program, overrides: dict[str, Any], text: str, doc_error) -> dict[str, Any]:
    """Unknown keys and wrong types are errors; valid overrides are returned for folding."""
    configs: dict[str, list[ast.Config]] = {}
    for info in program.modules.values():
        for item in info.module.items:
            if isinstance(item, ast.Config):
                configs.setdefault(item.name, []).append(item)
    config_at = _offset(text, _position(text, "config"))
    valid: dict[str, Any] = {}
    for key, value in overrides.items():
        decls = configs.get(key)
        if not decls:
            known = ", ".join(sorted(configs)) or "none"
            doc_error(key, "L0700", f"config override '{key}' names no config in this program (known: {known})",
                      config_at)
            continue
        declared = decls[0].type
        problem = _override_problem(declared, value)
        if problem:
            doc_error(key, "L0701", f"config override '{key}': {problem}", config_at)
            continue
        valid[key] = float(value) if isinstance(declared, ast.ScalarTypeRef) and declared.name in T.FLOAT_TYPES else value
    return valid


def _override_problem(declared: ast.TypeRef, value: Any) -> str | None:
    name = declared.name if isinstance(declared, (ast.ScalarTypeRef, ast.DynTypeRef)) else "?"
    got = type(value).__name__ if value is not None else "null"
    got = {"dict": "object", "list": "array", "int": "integer", "float": "number", "str": "string",
           "bool": "boolean"}.get(got, got)
    if name == "bool":
        return None if isinstance(value, bool) else f"expected boolean, got {got}"
    if name == "str":
        return None if isinstance(value, str) else f"expected string, got {got}"
    if name in T.INT_TYPES:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected integer ({name}), got {got}"
        lo, hi = T.INT_RANGES[name]
        return None if lo <= value <= hi else f"{value} does not fit in {name}"
    if name in T.FLOAT_TYPES:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected number ({name}), got {got}"
        return None
    return f"config of type {name} cannot be overridden"

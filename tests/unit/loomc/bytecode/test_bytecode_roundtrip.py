"""Every `.loom` in the repository survives text → .loombc → dis → .loombc byte for byte, spans included."""

from __future__ import annotations

import dataclasses
import re

import pytest

from bytecode_testlib import REPO, with_spans
from loomc.bytecode import read_module, write_module
from loomc.bytecode.literals import keywords
from loomc.bytecode.schema import DYN_TYPES, SCALAR_TYPES, SPECS, TAG_OF, Kind, live
from loomc.syntax import ast
from loomc.syntax.parse import parse_module
from loomc.syntax.printer import format_module, format_source

LOOM_FILES = sorted(p for p in REPO.rglob("*.loom") if ".venv" not in p.parts)
FENCE = re.compile(r"^```loom\n(.*?)^```[ \t]*$", re.M | re.S)
DOC_EXAMPLES = FENCE.findall((REPO / "docs" / "language.md").read_text(encoding="utf-8"))


def without_comments_and_blank_lines(text: str) -> str:
    """The source as `.loombc` keeps it: the comments' text and all blank lines removed."""
    lines = text.split("\n")
    for c in reversed(parse_module(text).comments):
        lines[c.line - 1] = lines[c.line - 1][: c.column - 1].rstrip()
    return "\n".join(line for line in lines if line.strip()) + "\n"


def assert_round_trip(text: str, path: str) -> None:
    module = parse_module(text, path)
    data = write_module(module)
    back = read_module(data, path)
    shown = format_module(back)  # what `loomc dis` prints

    assert back.items == module.items
    assert shown == format_source(without_comments_and_blank_lines(text))
    assert shown == format_module(ast.Module(path, module.items))
    assert format_source(shown) == shown
    # The spans are positions in the dis text: exactly what parsing it gives.
    assert with_spans(back.items) == with_spans(parse_module(shown, path).items)
    assert write_module(parse_module(shown, path)) == data
    assert write_module(back) == data


def test_the_repo_has_loom_files():
    assert len(LOOM_FILES) >= 10
    assert any("motifs" in p.parts for p in LOOM_FILES)
    assert len(DOC_EXAMPLES) >= 20


@pytest.mark.parametrize("path", LOOM_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_repo_file_round_trips(path):
    assert_round_trip(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))


def test_language_reference_examples_round_trip():
    for i, text in enumerate(DOC_EXAMPLES):
        assert_round_trip(text, f"example_{i}.loom")


def test_empty_module_round_trips():
    data = write_module(parse_module(""))
    assert read_module(data, "e.loom").items == []
    assert format_module(read_module(data, "e.loom")) == ""


def test_literal_spellings_survive():
    text = ('config a: u64 = 0xFF_FF\nconfig b: u8 = 0b1010_0101\nconfig c: f64 = 1_000.25e-3\n'
            'config d: str = "t\\t\\u{1F600}\\x41é"\nfn f() -> bytes {\n    return b"GG\\x03\\\\"\n}\n')
    back = read_module(write_module(parse_module(text)), "x.loom")
    assert format_module(back) == text
    assert back.items[0].value.value == 0xFFFF
    assert back.items[3].value.value == "t\t\U0001F600Aé"
    assert back.items[4].body.stmts[0].value.value == b"GG\x03\\"


# ---- the node vocabulary is closed and complete -----------------------------------------------------


def _ast_node_classes() -> set[type]:
    return {obj for obj in vars(ast).values()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == ast.__name__} \
        - {ast.Span, ast.Comment, ast.Module}


def test_schema_covers_every_ast_node_class():
    assert set(TAG_OF) == _ast_node_classes()


@pytest.mark.parametrize("spec", SPECS.values(), ids=lambda s: s.name)
def test_schema_covers_every_field(spec):
    stored = set(spec.spans)
    for f in spec.fields:
        stored |= set(f.attr.split(",")) if f.kind is Kind.LITERAL else {f.attr}
    assert stored == {f.name for f in dataclasses.fields(spec.cls)}


def test_enum_tables_match_the_grammar():
    assert set(live(SCALAR_TYPES)) | set(DYN_TYPES) <= keywords()
    for name in live(SCALAR_TYPES):
        assert parse_module(f"config x: {name}[1] = 0\n").items[0].type.dtype == name
    for name in DYN_TYPES:
        assert isinstance(parse_module(f"fn f(x: {name}) {{}}\n").items[0].args[0].type, ast.DynTypeRef)

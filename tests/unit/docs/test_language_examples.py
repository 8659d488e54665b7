"""Every worked example in docs/language.md is a real program: each ```loom block checks clean.

Blocks fenced ```loom are complete files; ```loom-fragment blocks are excerpts and are
not checked. A block whose first line is `// file: NAME.loom` is written under that name
(so another example can `use` it); every other block is written as example_N.loom. All
blocks are written into one directory before any is checked. Each ```json block is a
model document over those files and must pass `check_document` as well.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loomc.check import check_files
from loomc.check.document import check_document

DOC = Path(__file__).resolve().parents[3] / "docs" / "language.md"
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
FILE_LINE = re.compile(r"//\s*file:\s*(\S+\.loom)\s*$")


def blocks(kind: str) -> list[tuple[int, str]]:
    """(line of the opening fence, body) of every block fenced with exactly `kind`."""
    text = DOC.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(2))
            for m in FENCE.finditer(text) if m.group(1) == kind]


def file_name(index: int, body: str) -> str:
    first = body.split("\n", 1)[0]
    m = FILE_LINE.fullmatch(first.strip())
    return m.group(1) if m else f"example_{index}.loom"


LOOM = blocks("loom")
JSON = blocks("json")


def write_all(directory: Path) -> list[Path]:
    paths = []
    for i, (_, body) in enumerate(LOOM):
        path = directory / file_name(i, body)
        path.write_text(body, encoding="utf-8")
        paths.append(path)
    return paths


def test_the_document_has_examples():
    assert len(LOOM) >= 20
    assert blocks("loom-fragment"), "fragments are fenced loom-fragment"


def test_named_example_files_are_unique():
    names = [file_name(i, body) for i, (_, body) in enumerate(LOOM)]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("index", range(len(LOOM)), ids=[f"line{line}" for line, _ in LOOM])
def test_loom_example_checks_clean(tmp_path, index):
    paths = write_all(tmp_path)
    diagnostics, sources = check_files([paths[index]])
    assert not diagnostics, "\n".join(d.render(sources.get(d.path)) for d in diagnostics)


@pytest.mark.parametrize("index", range(len(JSON)), ids=[f"line{line}" for line, _ in JSON])
def test_model_document_example_checks_clean(tmp_path, index):
    write_all(tmp_path)
    body = JSON[index][1]
    assert isinstance(json.loads(body), dict)
    doc = tmp_path / "model.json"
    doc.write_text(body, encoding="utf-8")
    diagnostics, sources = check_document(doc)
    assert not diagnostics, "\n".join(d.render(sources.get(d.path)) for d in diagnostics)

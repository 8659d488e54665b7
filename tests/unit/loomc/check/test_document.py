"""`loomc check` on model documents: control, prepare and sources checked together, with config overrides."""

import json
import shutil
from pathlib import Path

import pytest

from loomc.check.document import check_document

FIXTURE = Path(__file__).parent / "fixtures" / "doc"


@pytest.fixture
def doc_dir(tmp_path: Path) -> Path:
    target = tmp_path / "doc"
    shutil.copytree(FIXTURE, target)
    return target


def write_doc(doc_dir: Path, **changes) -> Path:
    doc = json.loads((doc_dir / "model.json").read_text())
    doc.update(changes)
    path = doc_dir / "model.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def codes(path: Path) -> list[tuple[str, str, int, int]]:
    diagnostics, _ = check_document(path)
    return [(Path(d.path).name, d.code, d.line, d.column) for d in diagnostics]


def test_fixture_document_is_clean(doc_dir):
    assert codes(doc_dir / "model.json") == []


def test_unknown_config_override(doc_dir):
    path = write_doc(doc_dir, config={"dim": 64, "width": 3})
    # indent=2 dump: "config": { on line 9, "dim" on 10, "width" on 11
    assert codes(path) == [("model.json", "L0700", 11, 5)]


def test_override_of_the_wrong_type(doc_dir):
    path = write_doc(doc_dir, config={"dim": "64"})
    assert codes(path) == [("model.json", "L0701", 10, 5)]


def test_bool_is_not_an_integer_override(doc_dir):
    path = write_doc(doc_dir, config={"dim": True})
    assert [c[1] for c in codes(path)] == ["L0701"]


def test_integer_is_accepted_for_a_float_config(doc_dir):
    path = write_doc(doc_dir, config={"eps": 1})
    assert codes(path) == []


def test_override_changes_shapes_that_are_checked(doc_dir):
    # Overrides are folded before shapes are checked: dim=48 no longer divides into q4_1 blocks of 32.
    (doc_dir / "prepare.loom").write_text(
        'use "control.loom" { dim }\n\nparam norm: f32[dim] = checkpoint("n")\nparam w: q4_1[dim, dim] = checkpoint("w")\n')
    assert codes(doc_dir / "model.json") == []
    path = write_doc(doc_dir, config={"dim": 48})
    assert codes(path) == [("prepare.loom", "L0405", 4, 20)]


def test_override_value_reaches_control_code_types(doc_dir):
    path = write_doc(doc_dir, config={"greeting": 5})
    assert [c[1] for c in codes(path)] == ["L0701"]


def test_stage_without_command(doc_dir):
    (doc_dir / "control.loom").write_text(
        (doc_dir / "control.loom").read_text() + "\nstage extra(x: f32[T]) -> (y: f32[T])\n")
    assert codes(doc_dir / "model.json") == [("control.loom", "L0601", 11, 7)]


def test_command_signature_must_match_stage(doc_dir):
    text = (doc_dir / "model.loom").read_text().replace("-> (y: f32[T, dim])", "-> (y: f32[T, 32])")
    (doc_dir / "model.loom").write_text(text)
    # the result no longer matches the stage, and the body's call no longer fits the new result shape
    assert codes(doc_dir / "model.json") == [("model.loom", "L0600", 5, 34), ("model.loom", "L0400", 6, 25)]


def test_stage_declared_in_a_source(doc_dir):
    (doc_dir / "model.loom").write_text((doc_dir / "model.loom").read_text() + "\nstage other(x: f32[T])\n")
    assert ("model.loom", "L0606", 9, 7) in codes(doc_dir / "model.json")


def test_missing_source_file(doc_dir):
    path = write_doc(doc_dir, sources=["model.loom", "gone.loom"])
    assert [c[1] for c in codes(path)] == ["L0702"]


def test_invalid_json(doc_dir):
    (doc_dir / "model.json").write_text('{"model": "x",\n  "control": }')
    assert codes(doc_dir / "model.json") == [("model.json", "L0702", 2, 14)]


def test_duplicate_document_field(doc_dir):
    (doc_dir / "model.json").write_text('{"control": "control.loom", "control": "control.loom"}')
    assert [c[1] for c in codes(doc_dir / "model.json")] == ["L0702"]

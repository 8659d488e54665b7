"""`loomc build`, `loomc dis`, and `.loombc` wherever `loomc check` reads `.loom`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from loomc.bytecode import read_module, write_module
from loomc.check.document import check_document
from loomc.cli import main
from loomc.syntax.parse import parse_module

FIXTURE_DOC = Path(__file__).resolve().parents[1] / "check" / "fixtures" / "doc"

LIB = "config a: i64 = 2\n"
MAIN = 'use "lib.loom" { a }\n\n// a comment that .loombc drops\nfn twice() -> int {\n    return a * 2\n}\n'
ERROR_LINE = re.compile(r"^(?P<path>.+): error\[L0800\]: .+ at byte (?P<offset>\d+)$")


def loomc(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def src(tmp_path: Path) -> Path:
    (tmp_path / "lib.loom").write_text(LIB)
    (tmp_path / "main.loom").write_text(MAIN)
    return tmp_path


# ---- build ---------------------------------------------------------------------------------------------


def test_build_one_file(src):
    out = src / "main.loombc"
    r = loomc("build", str(src / "main.loom"), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == write_module(parse_module(MAIN))
    assert [p.name for p in src.iterdir() if p.name.startswith(".")] == []  # no temp files left


def test_build_several_files_into_a_directory(src):
    out = src / "out"
    out.mkdir()
    r = loomc("build", str(src / "lib.loom"), str(src / "main.loom"), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["lib.loombc", "main.loombc"]
    assert read_module((out / "lib.loombc").read_bytes(), "lib.loombc").items == parse_module(LIB).items


def test_build_a_folder(src):
    out = src.parent / "out"
    out.mkdir()
    r = loomc("build", str(src), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["lib.loombc", "main.loombc"]


def test_build_several_files_needs_an_existing_directory(src):
    r = loomc("build", str(src / "lib.loom"), str(src / "main.loom"), "-o", str(src / "nowhere"))
    assert r.exit_code == 1
    assert "must name an existing directory" in r.stderr
    assert not (src / "nowhere").exists()


def test_failing_check_writes_nothing(src):
    (src / "bad.loom").write_text("fn f() -> int {\n    return b\n}\n")
    out = src / "out"
    out.mkdir()
    r = loomc("build", str(src / "main.loom"), str(src / "bad.loom"), "-o", str(out))
    assert r.exit_code == 1
    assert "error[L0200]: unknown name 'b'" in r.stderr
    assert r.stderr.rstrip().endswith("1 error")
    assert list(out.iterdir()) == []


def test_build_refuses_model_documents(tmp_path):
    shutil.copytree(FIXTURE_DOC, tmp_path / "doc")
    r = loomc("build", str(tmp_path / "doc" / "model.json"), "-o", str(tmp_path / "x.loombc"))
    assert r.exit_code == 1
    assert "not model documents" in r.stderr
    assert "Traceback" not in r.output
    assert not (tmp_path / "x.loombc").exists()


def test_build_refuses_two_inputs_with_one_name(src):
    (src / "sub").mkdir()
    (src / "sub" / "lib.loom").write_text(LIB)
    out = src / "out"
    out.mkdir()
    r = loomc("build", str(src / "lib.loom"), str(src / "sub" / "lib.loom"), "-o", str(out))
    assert r.exit_code == 1 and "would be written here" in r.stderr
    assert list(out.iterdir()) == []


# ---- dis -----------------------------------------------------------------------------------------------


def test_dis_prints_the_canonical_text(src):
    out = src / "main.loombc"
    assert loomc("build", str(src / "main.loom"), "-o", str(out)).exit_code == 0
    r = loomc("dis", str(out))
    assert r.exit_code == 0
    assert r.stdout == 'use "lib.loom" { a }\nfn twice() -> int {\n    return a * 2\n}\n'
    assert r.stderr == ""


@pytest.mark.parametrize("mangle", [lambda d: d[:-3], lambda d: d[:20] + b"\xff" + d[21:], lambda d: b"nope"])
def test_dis_of_a_malformed_file_is_one_line(src, mangle):
    bad = src / "bad.loombc"
    bad.write_bytes(mangle(write_module(parse_module(MAIN))))
    r = loomc("dis", str(bad))
    assert r.exit_code == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1
    m = ERROR_LINE.match(lines[0])
    assert m and m["path"] == str(bad)
    assert "Traceback" not in r.output


def test_dis_of_a_missing_file(tmp_path):
    r = loomc("dis", str(tmp_path / "none.loombc"))
    assert r.exit_code == 1
    assert "error[L0203]" in r.stderr


# ---- .loombc wherever .loom is read ---------------------------------------------------------------------


def _build(path: Path) -> Path:
    out = path.with_suffix(".loombc")
    out.write_bytes(write_module(parse_module(path.read_text())))
    return out


def test_check_a_loombc_file(src):
    r = loomc("check", str(_build(src / "main.loom")))
    assert r.exit_code == 0, r.output


def test_a_module_may_use_a_loombc(src):
    _build(src / "lib.loom")
    (src / "lib.loom").unlink()
    (src / "main.loom").write_text(MAIN.replace('"lib.loom"', '"lib.loombc"'))
    r = loomc("check", str(src / "main.loom"))
    assert r.exit_code == 0, r.output


def test_diagnostics_in_a_loombc_point_at_its_dis_text(src):
    compiled = _build(src / "main.loom")
    (src / "lib.loom").write_text('config a: str = "x"\n')  # now `a * 2` is wrong
    r = loomc("check", str(compiled))
    assert r.exit_code == 1
    header = next(line for line in r.stderr.splitlines() if ": error[" in line)
    # Line 3 of the dis text (line 6 of main.loom, which has a comment and a blank line).
    assert header.startswith(f"{compiled}:3:14: error[L0300]"), r.stderr
    assert "    3 |     return a * 2" in r.stderr


def test_a_corrupt_loombc_is_one_L0800_diagnostic(src):
    bad = src / "main.loombc"
    bad.write_bytes(write_module(parse_module(MAIN))[:-1])
    r = loomc("check", str(bad))
    assert r.exit_code == 1
    assert re.match(rf"^{re.escape(str(bad))}:1:1: error\[L0800\]: .+ at byte \d+$", r.stderr.splitlines()[0])
    assert r.stderr.rstrip().endswith("1 error")

    (src / "user.loom").write_text('use "main.loombc" { twice }\n')
    r = loomc("check", "--json", str(src / "user.loom"))
    assert r.exit_code == 1
    [d] = json.loads(r.stdout)["diagnostics"]
    assert (d["code"], d["line"], d["column"]) == ("L0800", 1, 1) and "at byte" in d["message"]


def test_folders_contribute_loombc_files_to_check_but_not_to_fmt(src):
    (src / "junk.loombc").write_bytes(b"\x89LBC garbage")
    r = loomc("check", str(src))
    assert r.exit_code == 1 and "junk.loombc:1:1: error[L0800]" in r.stderr
    r = loomc("fmt", str(src))
    assert r.exit_code == 0, r.output
    assert (src / "junk.loombc").read_bytes() == b"\x89LBC garbage"


def test_model_document_sources_may_be_loombc(tmp_path):
    doc = tmp_path / "doc"
    shutil.copytree(FIXTURE_DOC, doc)
    _build(doc / "model.loom")
    _build(doc / "prepare.loom")
    (doc / "model.loom").unlink()
    model = json.loads((doc / "model.json").read_text())
    model["sources"] = ["model.loombc"]
    model["prepare"] = "prepare.loombc"
    (doc / "model.json").write_text(json.dumps(model))
    diagnostics, _ = check_document(doc / "model.json")
    assert diagnostics == []

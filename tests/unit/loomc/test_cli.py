"""The `loomc` command line as a user meets it: exit codes, one caret diagnostic per syntax error, no tracebacks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

LOOMC = [sys.executable, "-m", "loomc"]
FIXTURE_DOC = Path(__file__).parent / "check" / "fixtures" / "doc"


def loomc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(LOOMC + list(args), capture_output=True, text=True, cwd=cwd, timeout=120)


def test_clean_file_exits_zero(tmp_path):
    f = tmp_path / "ok.loom"
    f.write_text("config a: i64 = 1\n")
    r = loomc("check", str(f))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


@pytest.mark.parametrize("src,line,col", [
    ("config a: i64 = 1\nfn f() {\n    let x = (1 + 2\n}\n", 4, 1),
    ('fn f() -> str {\n    return "unterminated\n}\n', 2, 12),
    ("kernel k(x: f32[N]) {\n    parallel for i in 0..N {\n        x[i] = 1.0 $\n    }\n}\n", 3, 20),
    ("fn f() {\n", 2, 1),
])
def test_syntax_error_prints_one_diagnostic_with_caret(tmp_path, src, line, col):
    f = tmp_path / "bad.loom"
    f.write_text(src)
    r = loomc("check", str(f), cwd=tmp_path)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    headers = [l for l in r.stderr.splitlines() if ": error[" in l]
    assert len(headers) == 1
    assert headers[0].startswith(f"bad.loom:{line}:{col}: error[L01")
    lines = r.stderr.splitlines()
    caret = lines[lines.index(headers[0]) + 2]
    assert caret.rstrip().endswith("^")
    assert caret.index("^") - caret.index("|") - 2 == col - 1


def test_syntax_error_in_an_imported_file(tmp_path):
    (tmp_path / "lib.loom").write_text("config a: i64 = \n")
    (tmp_path / "main.loom").write_text('use "lib.loom" { a }\n')
    r = loomc("check", "main.loom", cwd=tmp_path)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("lib.loom:2:1: error[L0118]: expected an expression")


def test_semantic_errors_all_reported_in_order(tmp_path):
    f = tmp_path / "m.loom"
    f.write_text("fn f() -> int {\n    let a = b\n    return c\n}\n")
    r = loomc("check", str(f), cwd=tmp_path)
    assert r.returncode == 1
    headers = [l for l in r.stderr.splitlines() if ": error[" in l]
    assert headers == ["m.loom:2:13: error[L0200]: unknown name 'b'", "m.loom:3:12: error[L0200]: unknown name 'c'"]
    assert r.stderr.rstrip().endswith("2 errors")


def test_json_output(tmp_path):
    f = tmp_path / "m.loom"
    f.write_text("config a: i64 = 1.5\n")
    r = loomc("check", "--json", str(f), cwd=tmp_path)
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["diagnostics"] == [{
        "path": "m.loom", "line": 1, "column": 17, "end_line": 1, "end_column": 20,
        "severity": "error", "code": "L0300", "message": "config 'a' is i64, but its value is float literal",
    }]


def test_document_and_folder(tmp_path):
    r = loomc("check", str(FIXTURE_DOC / "model.json"))
    assert r.returncode == 0, r.stderr
    r = loomc("check", str(FIXTURE_DOC))
    assert r.returncode == 0, r.stderr


def test_missing_path(tmp_path):
    r = loomc("check", "nope.loom", cwd=tmp_path)
    assert r.returncode == 1
    assert "nope.loom:1:1: error[L0203]" in r.stderr


def test_fmt_check_and_rewrite(tmp_path):
    f = tmp_path / "m.loom"
    f.write_text("config   a : i64=1\n")
    r = loomc("fmt", "--check", str(f))
    assert r.returncode == 1
    assert "would reformat" in r.stderr
    assert f.read_text() == "config   a : i64=1\n"
    r = loomc("fmt", str(f))
    assert r.returncode == 0
    assert f.read_text() == "config a: i64 = 1\n"
    assert loomc("fmt", "--check", str(f)).returncode == 0


def test_fmt_on_a_syntax_error(tmp_path):
    f = tmp_path / "m.loom"
    f.write_text("config a: i64 = \n")
    r = loomc("fmt", str(f), cwd=tmp_path)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert f.read_text() == "config a: i64 = \n"


def test_internal_error_is_reported_not_raised(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import loomc.check
    from loomc.cli import main

    def boom(paths):
        raise RuntimeError("simulated checker bug")

    monkeypatch.setattr(loomc.check, "check_files", boom)
    f = tmp_path / "ok.loom"
    f.write_text("config a: i64 = 1\n")
    result = CliRunner().invoke(main, ["check", str(f)])
    assert result.exit_code == 2
    assert "internal compiler error: RuntimeError: simulated checker bug" in result.output
    assert "Traceback" not in result.output

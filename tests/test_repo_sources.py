"""Every `.loom` file in the repository checks clean and is already in canonical form."""

from pathlib import Path

import pytest

from loomc.check import check_files
from loomc.check.document import check_document
from loomc.syntax.printer import format_source

REPO = Path(__file__).resolve().parents[1]
LOOM_FILES = sorted(p for p in REPO.rglob("*.loom") if ".venv" not in p.parts)
DOCUMENTS = sorted(p for p in (REPO / "samples").rglob("model.json"))


def test_the_repo_has_loom_sources():
    assert any(p.parts[-2] == "scout" for p in LOOM_FILES)
    assert REPO / "samples" / "scout" / "model.json" in DOCUMENTS


@pytest.mark.parametrize("path", LOOM_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_source_is_canonical(path):
    text = path.read_text(encoding="utf-8")
    assert format_source(text, str(path)) == text, f"run: loomc fmt {path.relative_to(REPO)}"


def test_every_loom_file_checks_clean():
    diagnostics, sources = check_files(LOOM_FILES)
    assert [d.render(sources.get(d.path)) for d in diagnostics] == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_sample_document_checks_clean(path):
    diagnostics, sources = check_document(path)
    assert [d.render(sources.get(d.path)) for d in diagnostics] == []


def test_loomc_check_samples_scout_exits_zero():
    from click.testing import CliRunner

    from loomc.cli import main

    result = CliRunner().invoke(main, ["check", str(REPO / "samples" / "scout")])
    assert result.exit_code == 0, result.output


def test_test_module_basenames_are_unique(repo):
    """pytest imports test modules by basename (prepend mode, no packages): two files with the
    same name in different folders make collection fail, so every name is unique."""
    seen: dict[str, list[str]] = {}
    for path in (repo / "tests").rglob("*.py"):
        if path.name != "conftest.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(repo)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}

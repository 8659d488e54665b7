"""Where `loomd serve` with no documents finds its samples: `--samples DIR`, else `LOOM_SAMPLES`,
else the `samples/` of the source checkout loomd was imported from; with none of them it exits
naming where it looked (before any listener starts)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

import loomd.cli
from loomd.cli import find_samples, main


@pytest.fixture
def packages(tmp_path):
    """A folder holding one sample package."""
    (tmp_path / "pkgs" / "one").mkdir(parents=True)
    (tmp_path / "pkgs" / "one" / "model.json").write_text("{}")
    return tmp_path / "pkgs"


@pytest.fixture
def outside_checkout(tmp_path, monkeypatch):
    """loomd as if imported from an installed package: nothing beside it."""
    monkeypatch.setattr(loomd.cli, "CHECKOUT", tmp_path / "site-packages")
    monkeypatch.delenv("LOOM_SAMPLES", raising=False)
    return tmp_path / "site-packages"


def test_a_source_checkout_serves_its_own_samples(repo, monkeypatch):
    monkeypatch.delenv("LOOM_SAMPLES", raising=False)
    assert find_samples(None) == repo / "samples"   # what `make serve` runs from the repository root


def test_a_given_samples_folder_comes_before_the_checkout(packages):
    assert find_samples(packages) == packages


def test_serve_without_documents_or_samples_exits_saying_where_it_looked(outside_checkout):
    result = CliRunner().invoke(main, ["serve", "--listen", "127.0.0.1:0"])
    assert result.exit_code == 1, result.output
    message = " ".join(result.output.split())
    assert "no bundled samples found" in message
    assert "--samples DIR (not given)" in message and "$LOOM_SAMPLES (not set)" in message
    assert str(outside_checkout) in message
    assert "loomd serve DOC.json" in message and "LOOM_SAMPLES=DIR" in message


@pytest.mark.parametrize("via_env", [False, True], ids=["option", "env"])
def test_a_given_folder_without_sample_packages_is_refused_naming_its_source(outside_checkout, tmp_path,
                                                                           monkeypatch, via_env):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["serve", "--listen", "127.0.0.1:0"]
    if via_env:
        monkeypatch.setenv("LOOM_SAMPLES", str(empty))
    else:
        args += ["--samples", str(empty)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert str(empty) in result.output and "*/model.json" in result.output
    assert ("from LOOM_SAMPLES" if via_env else "from --samples") in result.output


def test_a_missing_samples_folder_is_refused(tmp_path):
    with pytest.raises(click.ClickException, match="is not a directory"):
        find_samples(tmp_path / "nowhere")

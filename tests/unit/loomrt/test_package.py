"""loomrt/package.py: package member names and the immutable package mapping."""

from __future__ import annotations

import pytest

from loomrt.errors import InvalidRequest
from loomrt.package import PackageFiles, join_inside, validate_member_name


@pytest.mark.parametrize("name", ["model.json", "model/control.loom", "a/b/c.loombc", "ünï/cödé.loom",
                                  "dots..in.name", ".hidden/x", "%2e%2e/x"])
def test_valid_names(name):
    assert validate_member_name(name) == name


@pytest.mark.parametrize("name, message", [
    ("", "package filename is empty"),
    ("a//b", "package filename 'a//b' has an empty component"),
    ("a/", "package filename 'a/' has an empty component"),
    ("./a", "package filename './a' has a '.' component"),
    ("a/./b", "package filename 'a/./b' has a '.' component"),
    ("../a", "package filename '../a' has a '..' component"),
    ("a/..", "package filename 'a/..' has a '..' component"),
    ("/etc/passwd", "package filename '/etc/passwd' is absolute; it must be a path inside the package"),
    ("a\\b", "package filename 'a\\\\b' contains a backslash; use '/' separators"),
    ("C:/x", "package filename 'C:/x' has a drive prefix"),
    ("c:x", "package filename 'c:x' has a drive prefix"),
    ("a\nb", "package filename 'a\\nb' contains control character U+000A"),
    ("a\x00b", "package filename 'a\\x00b' contains control character U+0000"),
    ("a\x7fb", "package filename 'a\\x7fb' contains control character U+007F"),
])
def test_forbidden_names(name, message):
    with pytest.raises(InvalidRequest) as exc:
        validate_member_name(name)
    assert exc.value.message == message
    assert exc.value.status == 400


def test_non_string_name():
    with pytest.raises(InvalidRequest, match="must be a string, got bytes"):
        validate_member_name(b"x")


def test_package_files_validates_and_is_immutable():
    pkg = PackageFiles({"m/a.loom": b"x", "m/b.loombc": bytearray(b"\x00\x01")})
    assert dict(pkg) == {"m/a.loom": b"x", "m/b.loombc": b"\x00\x01"}
    assert len(pkg) == 2 and "m/a.loom" in pkg
    assert pkg.has_directory("m") and pkg.has_directory("") and not pkg.has_directory("n")
    with pytest.raises(TypeError):
        pkg["m/c.loom"] = b""  # type: ignore[index]
    with pytest.raises(InvalidRequest, match="has a '..' component"):
        PackageFiles({"../x": b""})
    with pytest.raises(InvalidRequest, match="expected bytes, got str"):
        PackageFiles({"x": "text"})  # type: ignore[dict-item]


@pytest.mark.parametrize("base, ref, out", [
    ("", "a.loom", "a.loom"),
    ("model", "a.loom", "model/a.loom"),
    ("model", "../shared/k.loom", "shared/k.loom"),
    ("model/sub", "./../x//y.loom", "model/x/y.loom"),
    ("model", ".", "model"),
    ("model", "..", ""),
    ("model", "../..", None),
    ("", "../a", None),
    ("a", "b/../../../a", None),
])
def test_join_inside(base, ref, out):
    assert join_inside(base, ref) == out

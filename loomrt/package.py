"""An uploaded source package: validated member names mapped to their bytes.

`loomd`'s multipart registration and native staging build one with `validate_member_name`
on each file part's filename; `loomrt.document` resolves a model document's relative
code and metadata references inside it. The rules are the spec's ("Uploaded source
packages"): names are literal UTF-8 with `/` separators and no empty, `.` or `..`
components, absolute paths, backslashes, drive prefixes or control characters.
Authored references (what a document writes) may use `..` to reach a shared file, but
never above the package root, and a missing member fails: nothing falls back to the
server's files, so an upload can never silently run code it did not carry.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from loomrt.errors import InvalidRequest

_DRIVE = re.compile(r"^[A-Za-z]:")


def _control_char(name: str) -> str | None:
    for c in name:
        if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F:
            return c
    return None


def validate_member_name(name: object) -> str:
    """The name unchanged when it is a valid package filename, else `InvalidRequest`."""
    if not isinstance(name, str):
        raise InvalidRequest(f"package filename must be a string, got {type(name).__name__}")
    shown = repr(name)
    if name == "":
        raise InvalidRequest("package filename is empty")
    c = _control_char(name)
    if c is not None:
        raise InvalidRequest(f"package filename {shown} contains control character U+{ord(c):04X}")
    if "\\" in name:
        raise InvalidRequest(f"package filename {shown} contains a backslash; use '/' separators")
    if name.startswith("/"):
        raise InvalidRequest(f"package filename {shown} is absolute; it must be a path inside the package")
    if _DRIVE.match(name):
        raise InvalidRequest(f"package filename {shown} has a drive prefix")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            what = "an empty" if part == "" else f"a '{part}'"
            raise InvalidRequest(f"package filename {shown} has {what} component")
    return name


def reference_problem(ref: str) -> str | None:
    """Why an authored path (absolute or relative) is unusable, or None. `.`, `..` and
    empty components are allowed here: a reference is normalized before lookup."""
    if ref == "":
        return "empty path"
    c = _control_char(ref)
    if c is not None:
        return f"{ref!r} contains control character U+{ord(c):04X}"
    if "\\" in ref:
        return f"{ref!r} contains a backslash; use '/' separators"
    if _DRIVE.match(ref):
        return f"{ref!r} has a drive prefix"
    return None


def join_inside(base_dir: str, ref: str) -> str | None:
    """`ref` (relative, `/`-separated) taken from package directory `base_dir` ("" for the
    root), normalized; None when it climbs above the package root. The result is "" for
    the root itself (an `assets: "."` directory)."""
    parts: list[str] = [p for p in base_dir.split("/") if p]
    for part in ref.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


class PackageFiles(Mapping[str, bytes]):
    """Immutable member name → bytes, every name validated on construction.

    A Mapping rather than a dict so that the registration that retains it (until the model
    retires) cannot have members added or replaced behind the compiled programs' back."""

    def __init__(self, files: Mapping[str, bytes] | None = None):
        checked: dict[str, bytes] = {}
        for name, data in (files or {}).items():
            validate_member_name(name)
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise InvalidRequest(f"package member {name!r}: expected bytes, got {type(data).__name__}")
            checked[name] = bytes(data)
        self._files = checked

    def __getitem__(self, name: str) -> bytes:
        return self._files[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def has_directory(self, directory: str) -> bool:
        """Whether any member lies under `directory` ("" is the root)."""
        if directory == "":
            return bool(self._files)
        prefix = directory + "/"
        return any(name.startswith(prefix) for name in self._files)

    def __repr__(self) -> str:
        return f"PackageFiles({sorted(self._files)!r})"


__all__ = ["PackageFiles", "join_inside", "reference_problem", "validate_member_name"]

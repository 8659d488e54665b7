"""Uploaded source packages: package paths can never escape (spec: http-profiles.md, "Uploaded
source packages").

A multipart registration carries one `request` part (the model document) and `file` parts
whose filenames are paths inside the package. Every path-escape trick below is a 400 with
nothing registered (or staged); references inside the document resolve inside the package
and never fall back to server files; explicit absolute paths still name server files.
Bodies are built byte for byte here, so filenames no client library would send (control
characters, backslashes, empty) reach the server exactly as written.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from admin_http import (ORIGINAL, absolute_uses, assert_error, listed, registrations, wait_gone, wait_phase)
from loomd_process import Daemon, Response
from mini_package import MINI, mini_weights

REGISTER = "/v1/models/register"
VARIANTS = "/v1/models/variants"
SHARED = {name: (MINI / name).read_bytes() for name in ("control.loom", "prepare.loom", "model.loom")}
TWICE = ORIGINAL.replace("    add_bias(y, b)\n", "    add_bias(y, b)\n    add_bias(y, b)\n").encode()

KERNELS = ORIGINAL[ORIGINAL.index("kernel add_bias"):ORIGINAL.index("command affine")]
COMMANDS = TWICE.decode()[TWICE.decode().index("command affine"):]

#: Package filenames that must each be refused: (id, filename).
ESCAPES = [
    ("parent", "../x.loom"),
    ("absolute", "/etc/passwd"),
    ("inner-parent", "model/../../x"),
    ("parent-at-end", "model/x.loom/.."),
    ("dotdot", ".."),
    ("empty-component", "model//x.loom"),
    ("dot-first", "./x.loom"),
    ("dot-inner", "model/./x.loom"),
    ("trailing-slash", "model/"),
    ("empty", ""),
    ("drive-slash", "C:/x.loom"),
    ("drive-relative", "c:x.loom"),
    ("backslash", "model\\x.loom"),
    ("backslash-parent", "..\\x.loom"),
    ("nul", "x\x00.loom"),
    ("newline", "x\n.loom"),
    ("tab", "model/\tx.loom"),
    ("del", "x\x7f.loom"),
    ("c1-control", "x\x85.loom"),
]


# ---- multipart ------------------------------------------------------------------------------------------


def quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def multipart(parts: list[tuple[str, str | None, bytes]], content_type: str = "application/json") -> tuple[bytes, str]:
    """(body, Content-Type) for (name, filename, data) parts, in order, filenames sent literally."""
    boundary = "loom" + secrets.token_hex(12)
    out = b""
    for name, filename, data in parts:
        disposition = f"form-data; name={quoted(name)}"
        if filename is not None:
            disposition += f"; filename={quoted(filename)}"
        head = f"Content-Disposition: {disposition}\r\n"
        if name == "request":
            head += f"Content-Type: {content_type}\r\n"
        out += f"--{boundary}\r\n{head}\r\n".encode() + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def send(daemon: Daemon, path: str, parts: list[tuple[str, str | None, bytes]]) -> Response:
    body, content_type = multipart(parts)
    return daemon.request("POST", path, body, headers={"Content-Type": content_type})


def document(directory: Path, name: str, **fields) -> bytes:
    """A mini document with package-relative code and a server-local checkpoint."""
    checkpoint, _, _ = mini_weights(directory)
    doc = {"model": name, "kind": "sequence", "control": "control.loom", "prepare": "prepare.loom",
           "sources": ["model.loom"], "checkpoint": str(checkpoint), "rows": 2, "context_length": 16,
           "variant_capacity": 3}
    for key, value in fields.items():
        if value is None:
            doc.pop(key)
        else:
            doc[key] = value
    return json.dumps(doc).encode()


def package_parts(prefix: str = "model/", files: dict[str, bytes] | None = None) -> list[tuple[str, str, bytes]]:
    return [("file", prefix + name, data) for name, data in (SHARED if files is None else files).items()]


def assert_not_registered(daemon: Daemon, name: str) -> None:
    assert name not in registrations(daemon)
    assert name not in listed(daemon)


def unregister(daemon: Daemon, name: str) -> None:
    response = daemon.request("POST", "/v1/models/unregister", {"model": name, "mode": "abort"})
    assert response.status == 202, response.body
    wait_gone(daemon, name)


# ---- a valid package registers ---------------------------------------------------------------------------


def test_package_registration_uses_its_members(daemon, tmp_path):
    parts = [("request", "model/request.json", document(tmp_path, "pkg_ok"))] + package_parts()
    response = send(daemon, REGISTER, list(reversed(parts)))            # part order does not matter
    assert response.status == 202, response.body
    reg = wait_phase(daemon, "pkg_ok", "ready", "failed")
    assert reg["phase"] == "ready", reg
    inv = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "pkg_ok"}).json()
    detail = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "pkg_ok",
                                                      "X-Loom-Variant": str(inv["selected"])}).json()
    assert detail["sources"] == ["model/model.loom"]                  # the member, not a server file
    unregister(daemon, "pkg_ok")


def test_request_filename_defaults_to_request_json(daemon, tmp_path):
    parts = [("request", None, document(tmp_path, "pkg_root"))] + package_parts(prefix="")
    response = send(daemon, REGISTER, parts)
    assert response.status == 202, response.body
    assert wait_phase(daemon, "pkg_root", "ready", "failed")["phase"] == "ready"
    unregister(daemon, "pkg_root")


# ---- filenames that escape -----------------------------------------------------------------------------


@pytest.mark.parametrize(("trick", "filename"), ESCAPES, ids=[e[0] for e in ESCAPES])
def test_escaping_filename_rejects_registration(daemon, tmp_path, trick, filename):
    name = "esc_" + trick.replace("-", "_")
    parts = [("request", "model/request.json", document(tmp_path, name))] + package_parts()
    parts.append(("file", filename, SHARED["model.loom"]))
    error = assert_error(send(daemon, REGISTER, parts), 400, "package filename")
    assert error["code"] == "invalid_request"
    assert_not_registered(daemon, name)


@pytest.mark.parametrize(("trick", "filename"), ESCAPES, ids=[e[0] for e in ESCAPES])
def test_escaping_filename_rejects_staging(daemon, trick, filename):
    before = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "mini"}).json()
    request = json.dumps({"model": "mini", "base": before["selected"], "sources": ["model.loom"]}).encode()
    parts = [("request", "cand/candidate.json", request), ("file", "cand/model.loom", absolute_uses(
        TWICE.decode()).encode()), ("file", filename, b"kernel k() {}\n")]
    assert_error(send(daemon, VARIANTS, parts), 400, "package filename")
    after = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "mini"}).json()
    assert after["count"] == before["count"] and after["data"] == before["data"]


@pytest.mark.parametrize("filename", ["../request.json", "/srv/request.json", "model\\request.json",
                                      "model//request.json", "C:/request.json", "x\x01.json", ""])
def test_invalid_request_part_filename(daemon, tmp_path, filename):
    parts = [("request", filename, document(tmp_path, "badreq"))] + package_parts()
    assert_error(send(daemon, REGISTER, parts), 400)
    assert_not_registered(daemon, "badreq")


def test_url_encoding_is_literal(daemon, tmp_path):
    """`%2e%2e` is a literal directory name: valid, and never the parent directory."""
    # the document names the literal member: accepted, and it is that member that compiles
    files = {"control.loom": SHARED["control.loom"], "prepare.loom": SHARED["prepare.loom"],
             "%2e%2e/model.loom": absolute_uses(ORIGINAL).encode()}
    parts = [("request", "request.json", document(tmp_path, "pct_ok", sources=["%2e%2e/model.loom"]))]
    parts += package_parts(prefix="", files=files)
    response = send(daemon, REGISTER, parts)
    assert response.status == 202, response.body
    assert wait_phase(daemon, "pct_ok", "ready", "failed")["phase"] == "ready"
    inv = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "pct_ok"}).json()
    detail = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "pct_ok",
                                                      "X-Loom-Variant": str(inv["selected"])}).json()
    assert detail["sources"] == ["%2e%2e/model.loom"]
    unregister(daemon, "pct_ok")

    # a document reaching for the parent does not find the literally named member
    files = {"model/control.loom": SHARED["control.loom"], "model/prepare.loom": SHARED["prepare.loom"],
             "model/%2e%2e/x.loom": absolute_uses(ORIGINAL).encode(), "x.loom/keep": b""}
    parts = [("request", "model/sub/request.json",
              document(tmp_path, "pct_bad", control="../control.loom", prepare="../prepare.loom",
                       sources=["../../x.loom"]))]
    parts += package_parts(prefix="", files=files)
    assert_error(send(daemon, REGISTER, parts), 400, "sources[0]", "not in the uploaded package")
    assert_not_registered(daemon, "pct_bad")
    # and a `..` that would escape the package root never resolves at all
    parts[0] = ("request", "model/request.json",
                document(tmp_path, "pct_bad", sources=["../x.loom"]))
    response = send(daemon, REGISTER, parts[:1] + package_parts(files={k: v for k, v in SHARED.items()}))
    assert response.status == 400 and "x.loom" in response.json()["error"]["message"]
    assert_not_registered(daemon, "pct_bad")


# ---- references in the document --------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "origin"), [
    ("control", "../../control.loom", "model/request.json"),
    ("prepare", "../prepare.loom", "request.json"),
    ("sources", ["model.loom", "../../../model.loom"], "model/request.json"),
    ("sources", ["sub/../../../model.loom"], "model/request.json"),
])
def test_document_references_cannot_escape(daemon, tmp_path, field, value, origin):
    prefix = origin.rpartition("/")[0] + "/" if "/" in origin else ""
    parts = [("request", origin, document(tmp_path, "refesc", **{field: value}))] + package_parts(prefix=prefix)
    error = assert_error(send(daemon, REGISTER, parts), 400, "escapes the package root")
    assert error["param"].startswith(field)
    assert_not_registered(daemon, "refesc")


def test_missing_member_never_falls_back_to_server_files(daemon, tmp_path):
    # the server has this file, relative to its working directory and as a sibling path:
    # the package does not, so the reference fails rather than reading the disk
    on_disk = "tests/unit/loomrt/fixtures/mini/control.loom"
    assert (Path(__file__).resolve().parents[2] / on_disk).is_file()
    parts = [("request", "request.json", document(tmp_path, "nofall", control=on_disk))]
    parts += package_parts(prefix="")
    error = assert_error(send(daemon, REGISTER, parts), 400, "not in the uploaded package")
    assert error["param"] == "control"
    assert_not_registered(daemon, "nofall")
    # a document without its control member at all
    files = {k: v for k, v in SHARED.items() if k != "control.loom"}
    parts = [("request", "model/request.json", document(tmp_path, "nofall"))] + package_parts(files=files)
    assert_error(send(daemon, REGISTER, parts), 400, "control", "not in the uploaded package")
    assert_not_registered(daemon, "nofall")


def test_missing_use_member_fails_the_compile_without_fallback(daemon, tmp_path):
    """A `use` inside the package that names a member it lacks fails the registration even
    though a file of that name exists on the server beside the checkpoint."""
    (tmp_path / "prepare.loom").write_bytes(SHARED["prepare.loom"])   # on the server, never read
    files = {"control.loom": SHARED["control.loom"], "model.loom": SHARED["model.loom"]}
    parts = [("request", "request.json", document(tmp_path, "nouse", prepare=None,
                                                  base_directory=str(tmp_path)))]
    parts += package_parts(prefix="", files=files)
    response = send(daemon, REGISTER, parts)
    assert response.status == 202, response.body
    reg = wait_phase(daemon, "nouse", "ready", "failed")
    assert reg["phase"] == "failed" and reg["error"]["code"] == "compile_error", reg
    assert 'model.loom:2:' in reg["error"]["message"] and "prepare.loom" in reg["error"]["message"], reg["error"]
    unregister(daemon, "nouse")


def test_absolute_server_source_stays_server_local(daemon, tmp_path):
    """An explicit absolute path in `sources` names a server file; it combines with members."""
    server_source = tmp_path / "server_model.loom"
    server_source.write_text(absolute_uses(ORIGINAL))
    parts = [("request", "model/request.json",
              document(tmp_path, "abs_src", control=str(MINI / "control.loom"), prepare=str(MINI / "prepare.loom"),
                       sources=[str(server_source)]))]
    parts += package_parts(files={"unused.loom": b"// not referenced\n"})
    response = send(daemon, REGISTER, parts)
    assert response.status == 202, response.body
    assert wait_phase(daemon, "abs_src", "ready", "failed")["phase"] == "ready"
    inv = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "abs_src"}).json()
    detail = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "abs_src",
                                                      "X-Loom-Variant": str(inv["selected"])}).json()
    assert detail["sources"] == [server_source.as_posix()]

    # a candidate upload combines a member (the commands) with an absolute server provider (the kernels)
    kernels = tmp_path / "kernels.loom"
    kernels.write_text(KERNELS)
    commands = "\n".join([f'use "{MINI / "control.loom"}" {{ dim }}', f'use "{MINI / "prepare.loom"}" {{ w, b }}',
                          f'use "{kernels}" {{ add_bias, running_sum }}', "", "state acc: f32[dim] per row", "",
                          COMMANDS]).encode()
    request = json.dumps({"model": "abs_src", "base": inv["selected"],
                          "sources": [str(kernels), "commands.loom"]}).encode()
    response = send(daemon, VARIANTS, [("request", "cand/candidate.json", request),
                                       ("file", "cand/commands.loom", commands)])
    assert response.status == 200, response.body
    v = response.json()["variant"]
    assert v["phase"] == "ready" and v["sources"] == [kernels.as_posix(), "cand/commands.loom"]
    unregister(daemon, "abs_src")


def test_duplicates_and_stray_parts_reject(daemon, tmp_path):
    doc = document(tmp_path, "dups")
    base = [("request", "model/request.json", doc)] + package_parts()
    assert_error(send(daemon, REGISTER, base + [("file", "model/model.loom", b"")]), 400, "twice")
    assert_error(send(daemon, REGISTER, base + [("request", "other.json", doc)]), 400, "request")
    assert_error(send(daemon, REGISTER, base + [("file", "model/request.json", doc)]), 400, "request")
    assert_error(send(daemon, REGISTER, base + [("file", None, b"x")]), 400, "filename")
    assert_error(send(daemon, REGISTER, base + [("extra", "model/x.loom", b"x")]), 400, "extra")
    assert_not_registered(daemon, "dups")


def test_staging_upload_rejects_base_directory(daemon, tmp_path):
    before = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "mini"}).json()
    request = json.dumps({"model": "mini", "base": before["selected"], "sources": ["model.loom"],
                          "base_directory": str(tmp_path)}).encode()
    parts = [("request", "cand/candidate.json", request),
             ("file", "cand/model.loom", absolute_uses(TWICE.decode()).encode())]
    error = assert_error(send(daemon, VARIANTS, parts), 400, "base_directory")
    assert error["param"] == "base_directory"
    for field in ("prepare", "control"):
        request = json.dumps({"model": "mini", "base": before["selected"], "sources": ["model.loom"],
                              field: "control.loom"}).encode()
        assert_error(send(daemon, VARIANTS, [("request", "cand/candidate.json", request)] + parts[1:]), 400, field)
    assert daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "mini"}).json()["count"] == before["count"]

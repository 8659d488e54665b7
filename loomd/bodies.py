"""Request bodies as the routes consume them: a strict JSON object, or a multipart source package.

Every body is read once, bounded (`framing.read_body`). JSON goes through the one strict
decoder (`loomrt.fields.decode_object`); it is labelled application/json (or octet-stream,
or curl's default form type when the body is a JSON object). A multipart upload is "exactly
one `request` part with the endpoint's JSON, plus `file` parts whose filenames are package
member names"; a duplicate filename, a second request part, an unknown part name or a file
part without a filename is a 400 before anything is registered or staged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from loomd.framing import read_body
from loomd.multipart import Part, parse_multipart
from loomrt.errors import InvalidRequest
from loomrt.fields import U64_LIMIT, decode_object
from loomrt.package import PackageFiles, validate_member_name

DEFAULT_REQUEST_FILENAME = "request.json"


@dataclass(frozen=True)
class Upload:
    """What a register or staging request carried: its JSON, and the package when multipart."""

    body: dict[str, Any]
    raw: bytes
    package: PackageFiles | None = None
    origin: str = DEFAULT_REQUEST_FILENAME


def _limit(request: web.Request) -> int:
    from loomd.app import SETTINGS

    return request.app[SETTINGS].request_body_bytes


async def empty_body(request: web.Request) -> None:
    if await read_body(request, _limit(request)):
        raise InvalidRequest(f"{request.method} {request.path} takes no request body")


JSON_TYPES = ("application/json", "application/octet-stream")
FORM_TYPE = "application/x-www-form-urlencoded"   # what `curl -d` sends unless told otherwise


def _json_typed(request: web.Request, raw: bytes, expected: str) -> None:
    """Reject a body whose Content-Type is not JSON's. `curl -d '{...}'` labels a JSON body
    as form data, so under FORM_TYPE a body that starts like a JSON object is taken as JSON
    (strictly decoded after this); real form data (`a=1&b=2`) is still a 400."""
    if not raw or request.content_type in JSON_TYPES:
        return
    if request.content_type == FORM_TYPE:
        if raw.lstrip(b" \t\r\n").startswith(b"{"):
            return
        raise InvalidRequest(f"form data is not accepted: send a JSON object with Content-Type: application/json "
                             f"(got a {FORM_TYPE} body that is not a JSON object)")
    raise InvalidRequest(f"expected Content-Type {expected}, got {request.content_type!r}")


async def json_body(request: web.Request) -> dict[str, Any]:
    raw = await read_body(request, _limit(request))
    _json_typed(request, raw, "application/json")
    return decode_object(raw, "request body", U64_LIMIT)


async def form_parts(request: web.Request) -> list[Part]:
    """The parts of a multipart/form-data request, in order (the bounded body, parsed once)."""
    raw = await read_body(request, _limit(request))
    if request.content_type != "multipart/form-data":
        raise InvalidRequest(f"expected Content-Type multipart/form-data, got {request.content_type!r}")
    return parse_multipart(raw, request.headers.get("Content-Type", ""))


async def json_or_package(request: web.Request) -> Upload:
    """The JSON of a register/staging request, with its uploaded package if multipart."""
    raw = await read_body(request, _limit(request))
    if request.content_type != "multipart/form-data":
        _json_typed(request, raw or b"{", "application/json or multipart/form-data")
        return Upload(decode_object(raw, "request body"), raw)
    parts = parse_multipart(raw, request.headers.get("Content-Type", ""))
    requests = [p for p in parts if p.name == "request"]
    if len(requests) != 1:
        raise InvalidRequest(f"a multipart upload has exactly one 'request' part, got {len(requests)}")
    files: dict[str, bytes] = {}
    for part in parts:
        if part.name == "request":
            continue
        if part.name != "file":
            raise InvalidRequest(f"unknown multipart part {part.name!r} (expected 'request' and 'file' parts)")
        if part.filename is None:
            raise InvalidRequest("a 'file' part needs a filename: its path inside the package")
        name = validate_member_name(part.filename)
        if name in files:
            raise InvalidRequest(f"package file {name!r} appears twice")
        files[name] = part.data
    origin = requests[0].filename or DEFAULT_REQUEST_FILENAME
    validate_member_name(origin)
    if origin in files:
        raise InvalidRequest(f"package file {origin!r} is also the request part's filename")
    return Upload(decode_object(requests[0].data, "request part"), requests[0].data, PackageFiles(files), origin)


__all__ = ["DEFAULT_REQUEST_FILENAME", "Upload", "empty_body", "form_parts", "json_body", "json_or_package"]

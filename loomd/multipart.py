"""multipart/form-data, parsed once from the bounded body into ordered named parts.

Consumers get `Part`s (name, filename, content type, bytes) in arrival order and never look
at MIME boundaries again. Strict by design: a missing or malformed boundary, a part without
`Content-Disposition: form-data; name=...`, header bytes that are not UTF-8, a body that
ends before the closing delimiter, or data after the preamble that is not a delimiter, all
reject with 400. Filenames are taken literally (UTF-8, never URL-decoded); whether they
are acceptable package paths is the package's rule (`loomrt.package`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loomrt.errors import InvalidRequest

MAX_PARTS = 4096
MAX_PART_HEADER_BYTES = 16384
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def _fail(message: str) -> InvalidRequest:
    return InvalidRequest(f"malformed multipart body: {message}")


def parse_header_params(value: str) -> tuple[str, dict[str, str]]:
    """`type; a=1; b="x y"` → ("type", {"a": "1", "b": "x y"}); quoted-strings unescape `\\x`.
    A parameter named twice, or one with `*` (RFC 5987 encodings), is refused."""
    head, _, rest = value.partition(";")
    params: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        while i < n and rest[i] in " \t;":
            i += 1
        if i >= n:
            break
        m = _TOKEN.match(rest, i)
        if not m:
            raise _fail(f"bad parameter in {value!r}")
        key = m.group(0).lower()
        i = m.end()
        while i < n and rest[i] in " \t":
            i += 1
        if i >= n or rest[i] != "=":
            raise _fail(f"parameter {key!r} has no value in {value!r}")
        i += 1
        while i < n and rest[i] in " \t":
            i += 1
        if i < n and rest[i] == '"':
            i += 1
            out = []
            while i < n and rest[i] != '"':
                if rest[i] == "\\" and i + 1 < n:
                    i += 1
                out.append(rest[i])
                i += 1
            if i >= n:
                raise _fail(f"unterminated quoted string in {value!r}")
            i += 1
            text = "".join(out)
        else:
            m = _TOKEN.match(rest, i)
            if not m:
                raise _fail(f"bad value of parameter {key!r} in {value!r}")
            text, i = m.group(0), m.end()
        if key.endswith("*"):
            raise _fail(f"encoded parameter {key!r} is not supported; send the literal UTF-8 value")
        if key in params:
            raise _fail(f"parameter {key!r} appears twice in {value!r}")
        params[key] = text
        while i < n and rest[i] in " \t":
            i += 1
        if i < n and rest[i] != ";":
            raise _fail(f"unexpected {rest[i]!r} in {value!r}")
    return head.strip().lower(), params


def boundary_of(content_type: str) -> str:
    kind, params = parse_header_params(content_type)
    if kind != "multipart/form-data":
        raise InvalidRequest(f"expected multipart/form-data, got {kind!r}")
    boundary = params.get("boundary")
    if not boundary or len(boundary) > 70 or boundary.endswith(" "):
        raise _fail("missing or invalid boundary parameter")
    return boundary


def _part_headers(block: bytes) -> dict[str, str]:
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail("part headers are not UTF-8") from None
    headers: dict[str, str] = {}
    for line in text.split("\r\n"):
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise _fail(f"bad part header line {line!r}")
        key = name.lower()
        if key in headers:
            raise _fail(f"part header {name!r} appears twice")
        headers[key] = value.strip(" \t")
    return headers


def parse_multipart(body: bytes, content_type: str) -> list[Part]:
    """The parts of a complete multipart/form-data body, in order."""
    boundary = boundary_of(content_type).encode("ascii", "strict") if content_type.isascii() else b""
    if not boundary:
        raise _fail("boundary must be ASCII")
    delimiter = b"--" + boundary
    start = 0 if body.startswith(delimiter) else body.find(b"\r\n" + delimiter)
    if start < 0:
        raise _fail("no opening boundary")
    pos = start + (0 if start == 0 and body.startswith(delimiter) else 2) + len(delimiter)
    parts: list[Part] = []
    while True:
        if body.startswith(b"--", pos):
            rest = body[pos + 2:].lstrip(b" \t")  # transport padding, then nothing or CRLF epilogue
            if rest and not rest.startswith(b"\r\n"):
                raise _fail("data after the closing boundary")
            return parts
        while body.startswith((b" ", b"\t"), pos):  # transport padding
            pos += 1
        if not body.startswith(b"\r\n", pos):
            raise _fail("truncated body (no CRLF after a boundary)" if pos >= len(body) else "bad boundary line")
        pos += 2
        end_headers = body.find(b"\r\n\r\n", pos - 2)  # from the boundary line's CRLF: a part may have no headers
        if end_headers < 0 or end_headers - pos > MAX_PART_HEADER_BYTES:
            raise _fail("truncated or oversized part headers")
        headers = _part_headers(body[pos:end_headers]) if end_headers > pos else {}
        data_start = end_headers + 4
        next_delim = body.find(b"\r\n" + delimiter, data_start)
        if next_delim < 0:
            raise _fail("truncated body (no closing boundary)")
        disposition = headers.get("content-disposition")
        if disposition is None:
            raise _fail("a part has no Content-Disposition header")
        kind, params = parse_header_params(disposition)
        if kind != "form-data" or "name" not in params:
            raise _fail(f"Content-Disposition must be form-data with a name, got {disposition!r}")
        parts.append(Part(params["name"], params.get("filename"), headers.get("content-type"),
                          body[data_start:next_delim]))
        if len(parts) > MAX_PARTS:
            raise _fail(f"more than {MAX_PARTS} parts")
        pos = next_delim + 2 + len(delimiter)


__all__ = ["MAX_PARTS", "Part", "boundary_of", "parse_header_params", "parse_multipart"]

"""Helpers shared by the bytecode tests: span-aware AST comparison and section surgery on files."""

from __future__ import annotations

import dataclasses
import struct
import zlib
from pathlib import Path

from loomc.bytecode.cursor import Cursor
from loomc.bytecode.format import HEADER_BYTES
from loomc.bytecode.writer import pack
from loomc.syntax import ast

REPO = Path(__file__).resolve().parents[4]


def with_spans(node: object) -> object:
    """The node as nested tuples that include every span (AST equality ignores spans)."""
    if isinstance(node, list):
        return [with_spans(x) for x in node]
    if isinstance(node, tuple):
        return tuple(with_spans(x) for x in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, ast.Span):
        return (type(node).__name__,) + tuple((f.name, with_spans(getattr(node, f.name)))
                                              for f in dataclasses.fields(node))
    return node


def sections(data: bytes) -> list[tuple[int, bytes]]:
    """(id, bytes) of each section, in table order (the file must have a valid table)."""
    table = Cursor(data, HEADER_BYTES, len(data), "table")
    entries = [(table.uvarint("id"), table.uvarint("offset"), table.uvarint("length"))
               for _ in range(table.uvarint("count"))]
    base = table.pos
    return [(sid, data[base + off: base + off + length]) for sid, off, length in entries]


def table_end(data: bytes) -> int:
    table = Cursor(data, HEADER_BYTES, len(data), "table")
    for _ in range(table.uvarint("count") * 3):
        table.uvarint("entry")
    return table.pos


def replace_section(data: bytes, section_id: int, blob: bytes) -> bytes:
    return pack([(sid, blob if sid == section_id else old) for sid, old in sections(data)])


def reseal(data: bytes) -> bytes:
    """Fix the header's body length and checksum after a mutation, so the decoder sees the body."""
    if len(data) < HEADER_BYTES:
        return data
    body = data[HEADER_BYTES:]
    return data[:8] + struct.pack("<II", len(body), zlib.crc32(body)) + body

"""Checked module → `.loombc` bytes. `loomc build` calls `write_module`.

The writer first reduces the module to its canonical text (`format_module` without
comments or blank lines, which is exactly what `dis` prints) and parses that, so the
spans it stores are positions in the `dis` text and `text → .loombc → dis → .loombc`
is byte-identical. Every table is filled in first-use order, so one module has one
encoding.
"""

from __future__ import annotations

import zlib
from typing import Iterable

from loomc.bytecode.errors import LoomBytecodeEncodeError
from loomc.bytecode.format import (
    FORMAT_VERSION, HEADER, MAGIC, MAX_DEPTH, MAX_FILE_BYTES, ConstKind, Section,
)
from loomc.bytecode.schema import NONE, SPECS, TAG_OF, Field, Kind, NodeSpec, item_has_name
from loomc.bytecode.varint import svarint, uvarint
from loomc.syntax import ast
from loomc.syntax.diagnostics import LoomSyntaxError
from loomc.syntax.parse import parse_module
from loomc.syntax.printer import format_module


def write_module(module: ast.Module) -> bytes:
    """The `.loombc` bytes of a module; comments and layout are dropped, the rest is kept exactly."""
    return encode_items(canonical_module(module).items)


def canonical_module(module: ast.Module) -> ast.Module:
    """The module reparsed from the text `dis` prints for it, so its spans point into that text."""
    text = format_module(ast.Module(module.path, module.items))
    try:
        canon = parse_module(text, module.path)
    except LoomSyntaxError as exc:
        raise LoomBytecodeEncodeError(f"the module does not print as valid source: {exc}") from None
    if canon.items != module.items:
        raise LoomBytecodeEncodeError("the module's canonical text parses to a different module")
    return canon


def encode_items(items: Iterable[ast.Item], max_depth: int = MAX_DEPTH) -> bytes:
    """Encode items as given, spans included, with no canonicalisation and no shape checks.

    `write_module` is the entry point for real modules; tests call this directly to
    craft files the reader must reject (a deeper `max_depth` lets them exceed the limit)."""
    encoder = _Encoder(max_depth)
    for item in items:
        encoder.item(item)
    data = pack(encoder.sections())
    if len(data) > MAX_FILE_BYTES:
        raise LoomBytecodeEncodeError(f"the module needs {len(data)} bytes; a .loombc holds at most {MAX_FILE_BYTES}")
    return data


def pack(sections: list[tuple[int, bytes]]) -> bytes:
    """Header, section table and sections, in the order given (see `format.py`)."""
    table = bytearray(uvarint(len(sections)))
    offset = 0
    for section_id, blob in sections:
        table += uvarint(section_id) + uvarint(offset) + uvarint(len(blob))
        offset += len(blob)
    body = bytes(table) + b"".join(blob for _, blob in sections)
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body), zlib.crc32(body)) + body


class _Encoder:
    """Walks the AST once, filling the six sections; `sections()` serialises them."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.strings: dict[str, int] = {}
        self.constants: dict[tuple[ConstKind, str], int] = {}
        self.types: dict[bytes, int] = {}
        self.symbols = bytearray()
        self.num_symbols = 0
        self.code = bytearray()
        self.locations = bytearray()
        self.num_spans = 0
        self.line = self.column = 0  # the previous span's start: spans are stored as deltas

    # ---- tables ----

    def string(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings))

    def constant(self, kind: ConstKind, text: str) -> int:
        key = (kind, text)
        if key not in self.constants:
            self.string(text)
            self.constants[key] = len(self.constants)
        return self.constants[key]

    def span(self, span: ast.Span) -> None:
        self.locations += (svarint(span.line - self.line) + svarint(span.column - self.column)
                           + svarint(span.end_line - span.line) + svarint(span.end_column - span.column))
        self.line, self.column = span.line, span.column
        self.num_spans += 1

    # ---- nodes ----

    def item(self, item: ast.Item) -> None:
        tag = TAG_OF[type(item)]
        named = item_has_name(tag)
        self.symbols += uvarint(tag) + uvarint(self.string(item.name) + 1 if named else 0) + uvarint(len(self.code))
        self.num_symbols += 1
        self.body(self.code, item, SPECS[tag], 1, skip_name=named)

    def node(self, out: bytearray, node: object, depth: int) -> None:
        if depth > self.max_depth:
            raise LoomBytecodeEncodeError(f"the module nests deeper than {self.max_depth} levels, "
                                          f"which .loombc does not store (at {type(node).__name__})")
        tag = TAG_OF[type(node)]
        out += uvarint(tag)
        self.body(out, node, SPECS[tag], depth, skip_name=False)

    def body(self, out: bytearray, node: object, spec: NodeSpec, depth: int, skip_name: bool) -> None:
        for attr in spec.spans:
            self.span(getattr(node, attr))
        for field in spec.fields[1:] if skip_name else spec.fields:
            self.field(out, field, node, depth)

    def field(self, out: bytearray, f: Field, node: object, depth: int) -> None:
        kind = f.kind
        if kind is Kind.LITERAL:
            text_attr = f.attr.split(",")[1]
            out += uvarint(self.constant(f.const, getattr(node, text_attr)))
            return
        value = getattr(node, f.attr)
        if kind is Kind.NAME:
            out += uvarint(self.string(value))
        elif kind is Kind.OPT_NAME:
            out += uvarint(0 if value is None else self.string(value) + 1)
        elif kind is Kind.BOOL:
            out += uvarint(1 if value else 0)
        elif kind is Kind.ENUM:
            out += uvarint(f.table.index(value))
        elif kind is Kind.NODE:
            self.node(out, value, depth + 1)
        elif kind is Kind.OPT_NODE:
            if value is None:
                out += uvarint(NONE)
            else:
                self.node(out, value, depth + 1)
        elif kind in (Kind.NODES, Kind.OPT_NODES):
            if value is None:
                out += uvarint(0)
                return
            out += uvarint(len(value) + (kind is Kind.OPT_NODES))
            for child in value:
                self.node(out, child, depth + 1)
        elif kind is Kind.PAIRS:
            out += uvarint(len(value))
            for key, val in value:
                self.node(out, key, depth + 1)
                self.node(out, val, depth + 1)
        elif kind is Kind.TYPE:
            out += uvarint(self.type_ref(value, depth + 1))
        elif kind is Kind.OPT_TYPE:
            out += uvarint(0 if value is None else self.type_ref(value, depth + 1) + 1)
        else:
            raise AssertionError(kind)

    def type_ref(self, type_: ast.TypeRef, depth: int) -> int:
        """Index of the type's template; this occurrence's spans go to the locations stream."""
        template = bytearray()
        self.node(template, type_, depth)
        return self.types.setdefault(bytes(template), len(self.types))

    # ---- output ----

    def sections(self) -> list[tuple[int, bytes]]:
        strings = bytearray(uvarint(len(self.strings)))
        for text in self.strings:
            raw = text.encode("utf-8")
            strings += uvarint(len(raw)) + raw
        constants = bytearray(uvarint(len(self.constants)))
        for kind, text in self.constants:
            constants += uvarint(kind) + uvarint(self.strings[text])
        types = uvarint(len(self.types)) + b"".join(self.types)
        return [
            (Section.STRINGS, bytes(strings)),
            (Section.TYPES, types),
            (Section.SYMBOLS, uvarint(self.num_symbols) + bytes(self.symbols)),
            (Section.CODE, bytes(self.code)),
            (Section.CONSTANTS, bytes(constants)),
            (Section.LOCATIONS, uvarint(self.num_spans) + bytes(self.locations)),
        ]


__all__ = ["canonical_module", "encode_items", "pack", "write_module"]

"""`.loombc` bytes → `ast.Module`, treating every input as hostile. Called by `Program.load` and `loomc dis`.

Any problem is a `LoomBytecodeError` with the byte offset where it was found, never
another exception. The bounds that make that safe:

* the header is checked (magic, version, flags, length, CRC32) before anything else;
* every read goes through a `Cursor` confined to one section;
* every count is refused unless the bytes left in its section could hold that many
  entries, before anything is allocated for them;
* every node takes one span from the locations section (at least four bytes each),
  so the nodes a file can describe are bounded by its size, however often a type
  template is reused; nesting is bounded by `MAX_DEPTH`, one Python frame per level;
* names, literal texts and the shapes of expressions and blocks are checked as each
  node is built, so what is returned is an AST the parser could have produced from
  its `dis` text, spans included.
"""

from __future__ import annotations

import zlib

from loomc.bytecode import printable
from loomc.bytecode.cursor import Cursor
from loomc.bytecode.errors import LoomBytecodeError
from loomc.bytecode.format import (
    FORMAT_VERSION, HEADER, HEADER_BYTES, MAGIC, MAX_DEPTH, MAX_FILE_BYTES, MAX_POSITION, MAX_SECTIONS,
    MIN_SPAN_BYTES, ConstKind, Section,
)
from loomc.bytecode.literals import literal_value, name_problem
from loomc.bytecode.schema import (
    BINARY, BLOCK, CALL, INDEX, ITEM_TAGS, NONE, RETIRED, SPECS, TYPE_TAGS, UNARY, Field, Kind, describe, item_has_name,
)
from loomc.syntax import ast

_OPERAND_TAGS = frozenset({BINARY, UNARY, CALL, INDEX})
_SECTION_IDS = frozenset(int(s) for s in Section)


def read_module(data: bytes, path: str) -> ast.Module:
    """Decode a `.loombc` file; `path` is the module's display path for diagnostics."""
    data = bytes(data)  # a private, immutable snapshot
    try:
        items = _Reader(data).items()
    except RecursionError:  # only when the caller is already deep in its own stack
        raise LoomBytecodeError("nesting too deep for the reader's stack", 0) from None
    return ast.Module(path, items)


class _NoSpans:
    """The span source while type templates are validated: they carry no spans of their own."""

    def next(self, at: int) -> ast.Span:
        return ast.NO_SPAN


class _Spans:
    """The locations section: a count, then per span four zigzag varints
    (line and column as deltas from the previous span's start, end line and end column
    as deltas from this span's start)."""

    def __init__(self, cur: Cursor):
        self.cur = cur
        self.left = cur.count("span count", MIN_SPAN_BYTES)
        self.line = self.column = 0

    def next(self, at: int) -> ast.Span:
        if not self.left:
            raise LoomBytecodeError("the node at this offset has no source location left", at)
        self.left -= 1
        cur = self.cur
        start = cur.pos
        line = self.line + cur.svarint("span line")
        column = self.column + cur.svarint("span column")
        end_line = line + cur.svarint("span end line")
        end_column = column + cur.svarint("span end column")
        if not (0 <= line <= MAX_POSITION and 0 <= column <= MAX_POSITION
                and 0 <= end_line <= MAX_POSITION and 0 <= end_column <= MAX_POSITION):
            raise LoomBytecodeError(f"source location {line}:{column}-{end_line}:{end_column} is out of range", start)
        self.line, self.column = line, column
        return ast.Span(line, column, end_line, end_column)

    def expect_end(self) -> None:
        if self.left:
            raise LoomBytecodeError(f"{self.left} source locations belong to no node", self.cur.pos)
        self.cur.expect_end()


class _Reader:
    """One file's decoding: the container and tables are checked on construction, `items()` decodes the code."""

    def __init__(self, data: bytes):
        self.data = data
        self.sections = self._layout()
        self.strings = self._strings()
        self.names: dict[int, str] = {}  # string indices already checked as names
        self.constants = self._constants()
        self.spans: _Spans | _NoSpans = _NoSpans()
        self.type_starts = self._types()
        self.spans = _Spans(self._cursor(Section.LOCATIONS))

    # ---- container -----------------------------------------------------------------------------

    def _layout(self) -> dict[Section, tuple[int, int]]:
        """Check the header and section table; (start, end) of each section."""
        data, n = self.data, len(self.data)
        if n > MAX_FILE_BYTES:
            raise LoomBytecodeError(f"file is {n} bytes; a .loombc holds at most {MAX_FILE_BYTES}", MAX_FILE_BYTES)
        if n < HEADER_BYTES:
            if data[:len(MAGIC)] != MAGIC[:n]:
                raise LoomBytecodeError("not a .loombc file (bad magic)", 0)
            raise LoomBytecodeError(f"truncated header: {n} bytes, a header needs {HEADER_BYTES}", n)
        magic, version, flags, body_bytes, crc = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise LoomBytecodeError("not a .loombc file (bad magic)", 0)
        if version != FORMAT_VERSION:
            raise LoomBytecodeError(f".loombc format version {version} is not supported; "
                                    f"this loomc reads version {FORMAT_VERSION}", 4)
        if flags:
            raise LoomBytecodeError(f"reserved header flags {flags:#06x} must be zero", 6)
        if body_bytes != n - HEADER_BYTES:
            raise LoomBytecodeError(f"the header says the body is {body_bytes} bytes, but the file has "
                                    f"{n - HEADER_BYTES} (truncated or extended)", 8)
        actual = zlib.crc32(memoryview(data)[HEADER_BYTES:])
        if actual != crc:
            raise LoomBytecodeError(f"checksum mismatch: the header says {crc:#010x}, the body's is {actual:#010x}", 12)

        table = Cursor(data, HEADER_BYTES, n, "section table")
        count = table.count("section count", 3)
        if count > MAX_SECTIONS:
            raise LoomBytecodeError(f"{count} sections; a .loombc has at most {MAX_SECTIONS}", HEADER_BYTES)
        entries = []
        for _ in range(count):
            at = table.pos
            entries.append((at, table.uvarint("section id"), table.uvarint("section offset"),
                            table.uvarint("section length")))
        base = table.pos
        found: dict[Section, tuple[int, int, int]] = {}
        for at, section_id, offset, length in entries:
            if section_id not in _SECTION_IDS:
                raise LoomBytecodeError(f"unknown section id {section_id}", at)
            section = Section(section_id)
            if section in found:
                raise LoomBytecodeError(f"duplicate {_section_name(section)} section", at)
            if base + offset + length > n:
                raise LoomBytecodeError(f"the {_section_name(section)} section (offset {offset}, {length} bytes) "
                                        f"runs past the end of the file", at)
            found[section] = (at, base + offset, base + offset + length)
        for section in Section:
            if section not in found:
                raise LoomBytecodeError(f"missing {_section_name(section)} section", base)
        expected = base
        for section, (at, start, end) in sorted(found.items(), key=lambda kv: kv[1][1:]):
            if start < expected:
                raise LoomBytecodeError(f"the {_section_name(section)} section overlaps the section before it", at)
            if start > expected:
                raise LoomBytecodeError(f"{start - expected} bytes before the {_section_name(section)} section "
                                        f"belong to no section", at)
            expected = end
        if expected != n:
            raise LoomBytecodeError(f"{n - expected} bytes after the last section belong to no section", expected)
        return {section: (start, end) for section, (_, start, end) in found.items()}

    def _cursor(self, section: Section) -> Cursor:
        start, end = self.sections[section]
        return Cursor(self.data, start, end, _section_name(section))

    # ---- tables ---------------------------------------------------------------------------------

    def _strings(self) -> list[str]:
        cur = self._cursor(Section.STRINGS)
        strings: list[str] = []
        for _ in range(cur.count("string count")):
            raw = cur.take(cur.uvarint("string length"), "string")
            try:
                strings.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise LoomBytecodeError(f"string {len(strings)} is not valid UTF-8", cur.pos - len(raw) + exc.start)
        cur.expect_end()
        return strings

    def _constants(self) -> list[tuple[ConstKind, object, str]]:
        cur = self._cursor(Section.CONSTANTS)
        constants: list[tuple[ConstKind, object, str]] = []
        for i in range(cur.count("constant count", 2)):
            at = cur.pos
            kind = ConstKind(cur.index("constant kind", len(ConstKind)))
            text = self.strings[cur.index("string index", len(self.strings))]
            try:
                constants.append((kind, literal_value(kind, text), text))
            except ValueError as exc:
                raise LoomBytecodeError(f"constant {i}: {exc}", at)
        cur.expect_end()
        return constants

    def _types(self) -> list[int]:
        """Validate every type template once (without spans); where each starts."""
        cur = self._cursor(Section.TYPES)
        starts = []
        for _ in range(cur.count("type count")):
            starts.append(cur.pos)
            self._node(cur, TYPE_TAGS, "a type", 1)
        cur.expect_end()
        return starts

    def _name(self, cur: Cursor) -> str:
        at = cur.pos
        return self._name_at(cur.uvarint("string index"), at)

    def _name_at(self, i: int, at: int) -> str:
        """String `i`, which must be an identifier that is not a keyword."""
        name = self.names.get(i)
        if name is None:
            if i >= len(self.strings):
                raise LoomBytecodeError(f"string index {i} is out of range ({len(self.strings)} entries)", at)
            problem = name_problem(self.strings[i])
            if problem:
                raise LoomBytecodeError(problem, at)
            name = self.names[i] = self.strings[i]
        return name

    # ---- items and nodes ------------------------------------------------------------------------

    def items(self) -> list[ast.Item]:
        symbols = self._cursor(Section.SYMBOLS)
        entries = []
        for i in range(symbols.count("symbol count", 3)):
            at = symbols.pos
            tag = symbols.uvarint("item kind")
            if tag not in ITEM_TAGS:
                raise LoomBytecodeError(f"symbol {i}: expected an item kind, found {describe(tag)}", at)
            name_at = symbols.pos
            raw = symbols.uvarint("symbol name")  # 0: no name; else string index + 1
            name = None
            if item_has_name(tag):
                if raw == 0:
                    raise LoomBytecodeError(f"symbol {i}: a {SPECS[tag].name} needs a name", name_at)
                name = self._name_at(raw - 1, name_at)
            elif raw != 0:
                raise LoomBytecodeError(f"symbol {i}: a {SPECS[tag].name} has no name", name_at)
            entries.append((at, tag, name, symbols.uvarint("code offset")))
        symbols.expect_end()

        code = self._cursor(Section.CODE)
        start = code.pos
        items = []
        for i, (at, tag, name, offset) in enumerate(entries):
            if code.pos - start != offset:
                raise LoomBytecodeError(f"symbol {i} says its code starts at {offset}, but it starts at "
                                        f"{code.pos - start}", at)
            items.append(self._node(code, ITEM_TAGS, "an item", 1, tag, name))
        code.expect_end()
        self.spans.expect_end()
        return items

    def _node(self, cur: Cursor, allowed: frozenset[int], what: str, depth: int,
              tag: int | None = None, name: str | None = None) -> object:
        """One node and everything below it, in one Python frame per level.

        Items arrive with `tag` and `name` from the symbols section; every other node
        starts with its tag, which must be one the slot allows."""
        at = cur.pos
        if tag is None:
            tag = cur.uvarint("node tag")
            if tag not in allowed:
                raise LoomBytecodeError(f"expected {what}, found {describe(tag)}", at)
        if depth > MAX_DEPTH:
            raise LoomBytecodeError(f"nodes nest deeper than {MAX_DEPTH} levels", at)
        spec = SPECS[tag]
        values: dict[str, object] = {}
        for attr in spec.spans:
            values[attr] = self.spans.next(at)
        fields = spec.fields
        if name is not None:
            values["name"] = name
            fields = fields[1:]
        for f in fields:
            kind = f.kind
            if kind is Kind.NODE:
                values[f.attr] = self._node(cur, f.tags, f.what, depth + 1)
            elif kind is Kind.OPT_NODE:
                if cur.pos < cur.end and cur.data[cur.pos] == NONE:
                    cur.pos += 1
                    values[f.attr] = None
                else:
                    values[f.attr] = self._node(cur, f.tags, f.what, depth + 1)
            elif kind is Kind.NODES or kind is Kind.OPT_NODES:
                n = self._list_count(cur, spec.name, f)
                if n is None:
                    values[f.attr] = None
                    continue
                children = []
                for _ in range(n):
                    children.append(self._node(cur, f.tags, f.what, depth + 1))
                values[f.attr] = children
            elif kind is Kind.PAIRS:
                pairs = []
                for _ in range(cur.count(f"{spec.name}.{f.attr} count", 2)):
                    key = self._node(cur, f.tags, f.what, depth + 1)
                    pairs.append((key, self._node(cur, f.tags, f.what, depth + 1)))
                values[f.attr] = pairs
            elif kind is Kind.TYPE or kind is Kind.OPT_TYPE:
                template = self._template(cur, spec.name, f)
                values[f.attr] = None if template is None else self._node(template, TYPE_TAGS, "a type", depth + 1)
            else:
                self._leaf(cur, spec.name, f, values)
        node = spec.cls(**values)
        if tag in _OPERAND_TAGS:
            problem = printable.operand_problem(node)
        elif tag == BLOCK:
            problem = printable.block_problem(node.stmts)
        else:
            problem = None
        if problem:
            raise LoomBytecodeError(f"{problem} (the parser could not have built this {spec.name})", at)
        return node


    # Field kinds that read no child nodes; kept out of `_node` so it stays one frame per level.

    def _list_count(self, cur: Cursor, owner: str, f: Field) -> int | None:
        """The length of a NODES list, or of an OPT_NODES list (None when absent)."""
        at = cur.pos
        if f.kind is Kind.OPT_NODES:
            n = cur.uvarint(f"{owner}.{f.attr} count")  # 0: absent; else count + 1
            if n == 0:
                return None
            n -= 1
            if n > cur.remaining:
                raise LoomBytecodeError(f"{owner}.{f.attr}: {n} claimed, but only {cur.remaining} "
                                        f"bytes remain in the {cur.where} section", at)
        else:
            n = cur.count(f"{owner}.{f.attr} count")
        if n < f.min_count:
            raise LoomBytecodeError(f"{owner}.{f.attr} needs at least {f.min_count}", at)
        return n

    def _template(self, cur: Cursor, owner: str, f: Field) -> Cursor | None:
        """A cursor on the type template a TYPE field names (None for an absent OPT_TYPE)."""
        at = cur.pos
        i = cur.uvarint(f"{owner}.{f.attr} type index")
        if f.kind is Kind.OPT_TYPE:
            if i == 0:
                return None
            i -= 1
        if i >= len(self.type_starts):
            raise LoomBytecodeError(f"type index {i} is out of range ({len(self.type_starts)} entries)", at)
        return Cursor(self.data, self.type_starts[i], self.sections[Section.TYPES][1], "types")

    def _leaf(self, cur: Cursor, owner: str, f: Field, values: dict[str, object]) -> None:
        at = cur.pos
        kind = f.kind
        if kind is Kind.NAME:
            values[f.attr] = self._name(cur)
        elif kind is Kind.OPT_NAME:
            raw = cur.uvarint(f"{owner}.{f.attr}")  # 0: none; else string index + 1
            values[f.attr] = None if raw == 0 else self._name_at(raw - 1, at)
        elif kind is Kind.ENUM:
            code = cur.index(f"{owner}.{f.attr}", len(f.table))
            if isinstance(f.table[code], str) and f.table[code].startswith(RETIRED):
                raise LoomBytecodeError(f"{owner}.{f.attr}: code {code} is the {f.table[code]}, which this compiler "
                                        "no longer has; rebuild the program from its source", at)
            values[f.attr] = f.table[code]
        elif kind is Kind.BOOL:
            flag = cur.uvarint(f"{owner}.{f.attr}")
            if flag > 1:
                raise LoomBytecodeError(f"{owner}.{f.attr} must be 0 or 1, found {flag}", at)
            values[f.attr] = bool(flag)
        elif kind is Kind.LITERAL:
            const_kind, value, text = self.constants[cur.index("constant index", len(self.constants))]
            if const_kind is not f.const:
                raise LoomBytecodeError(f"{owner} needs {f.const.name.lower()} constant, "
                                        f"found {const_kind.name.lower()}", at)
            value_attr, text_attr = f.attr.split(",")
            values[value_attr] = value
            values[text_attr] = text
        else:
            raise AssertionError(kind)


def _section_name(section: Section) -> str:
    return section.name.lower()

"""The `.loombc` container: magic, version, header, section ids and the reader's limits.

The writer and the reader both take every number from here, so the two cannot drift.
The node vocabulary (tags and fields) lives in `schema.py`.

```
offset  bytes  field
     0      4  MAGIC  b"\\x89LBC"  (a non-ASCII first byte: a text file never passes)
     4      2  FORMAT_VERSION, u16 little-endian
     6      2  flags, u16, reserved: must be 0
     8      4  body_bytes, u32: the file's length minus HEADER_BYTES
    12      4  crc32 (zlib) of the body, u32
    16      …  body: section table, then the sections
```

The section table is a varint count, then per section three varints: id, offset and
length. Offsets count from the first byte after the table, so the table's own size never
feeds back into the numbers it holds. The sections tile the rest of the file exactly:
no gaps, no overlaps, each id once.
"""

from __future__ import annotations

import struct
from enum import IntEnum

SUFFIX = ".loombc"

MAGIC = b"\x89LBC"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sHHII")  # magic, version, flags, body_bytes, crc32
HEADER_BYTES = HEADER.size


class Section(IntEnum):
    """Section ids, in the order the writer lays them out."""

    STRINGS = 1  # every name and literal text, UTF-8, each once
    TYPES = 2  # type templates (no spans), each distinct type once
    SYMBOLS = 3  # per item: kind, name, where its code starts
    CODE = 4  # per item: its fields and the statements and expressions below it
    CONSTANTS = 5  # literals: kind and source text (the value is derived from the text)
    LOCATIONS = 6  # one span per node field of type Span, in decoding order, delta-encoded


class ConstKind(IntEnum):
    INT = 0
    FLOAT = 1
    STR = 2
    BYTES = 3


# ---- limits: what the reader refuses before allocating -------------------------------------------

MAX_FILE_BYTES = 64 * 1024 * 1024  # a module's bytecode is kilobytes; anything this big is hostile
MAX_SECTIONS = 16  # table entries; six are defined, the rest only lets the reader name the problem
MAX_DEPTH = 256  # nesting of nodes (items, blocks, statements, expressions, types)
MAX_VARINT_BYTES = 10  # LEB128 of a value below 2**64
MAX_POSITION = 2**31 - 1  # a span's line or column
MIN_SPAN_BYTES = 4  # four varints: the bound on how many nodes a file can describe

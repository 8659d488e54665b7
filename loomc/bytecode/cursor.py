"""A bounded read position in untrusted bytes: every read checks the end first.

The reader never indexes `data` itself; it goes through a `Cursor`, whose `end` is the
end of the current section, so a bad length or count can never read past the section
or make the reader allocate more than the bytes that remain could describe.
"""

from __future__ import annotations

from loomc.bytecode.errors import LoomBytecodeError
from loomc.bytecode.format import MAX_VARINT_BYTES


class Cursor:
    __slots__ = ("data", "pos", "end", "where")

    def __init__(self, data: bytes, pos: int, end: int, where: str):
        self.data = data
        self.pos = pos
        self.end = end
        self.where = where  # the section's name, for messages

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def fail(self, message: str, at: int | None = None) -> LoomBytecodeError:
        return LoomBytecodeError(message, self.pos if at is None else at)

    def uvarint(self, what: str) -> int:
        """One minimal LEB128 value below 2**64."""
        data, pos, end = self.data, self.pos, self.end
        if pos < end and data[pos] < 0x80:  # the common case: one byte
            self.pos = pos + 1
            return data[pos]
        start, value, shift = pos, 0, 0
        while True:
            if pos >= end:
                raise LoomBytecodeError(f"truncated {what}: the {self.where} section ends inside a varint", end)
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if pos - start >= MAX_VARINT_BYTES:
                raise LoomBytecodeError(f"{what}: varint longer than {MAX_VARINT_BYTES} bytes", start)
        if value >= 1 << 64:
            raise LoomBytecodeError(f"{what}: varint {value} does not fit in 64 bits", start)
        if byte == 0 and pos - start > 1:
            raise LoomBytecodeError(f"{what}: varint is not minimally encoded", start)
        self.pos = pos
        return value

    def svarint(self, what: str) -> int:
        value = self.uvarint(what)
        return value >> 1 if not value & 1 else -(value >> 1) - 1

    def count(self, what: str, min_bytes_each: int = 1) -> int:
        """A count of things that follow, refused when the bytes left cannot hold that many."""
        at = self.pos
        n = self.uvarint(what)
        if n * min_bytes_each > self.end - self.pos:
            raise LoomBytecodeError(f"{what}: {n} claimed, but only {self.end - self.pos} bytes remain "
                                    f"in the {self.where} section", at)
        return n

    def index(self, what: str, size: int) -> int:
        """An index into a table of `size` entries."""
        at = self.pos
        i = self.uvarint(what)
        if i >= size:
            raise LoomBytecodeError(f"{what} {i} is out of range ({size} entries)", at)
        return i

    def take(self, n: int, what: str) -> bytes:
        if n > self.end - self.pos:
            raise LoomBytecodeError(f"truncated {what}: {n} bytes claimed, {self.end - self.pos} remain", self.pos)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def expect_end(self) -> None:
        if self.pos != self.end:
            raise LoomBytecodeError(f"{self.end - self.pos} unused bytes at the end of the {self.where} section",
                                    self.pos)

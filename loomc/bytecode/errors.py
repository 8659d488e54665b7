"""The two ways bytecode fails: a file the reader rejects, and a module the writer cannot store."""

from __future__ import annotations


class LoomBytecodeError(Exception):
    """A `.loombc` input the reader rejects. `offset` is the byte where the problem was found.

    Raised for every malformed, truncated, oversized, version-mismatched or corrupt
    input, and never anything else, so callers need exactly one `except`.
    `str(exc)` is `"<message> at byte <offset>"`, the form `loomc` prints."""

    def __init__(self, message: str, offset: int):
        super().__init__(f"{message} at byte {offset}")
        self.message = message
        self.offset = offset


class LoomBytecodeEncodeError(ValueError):
    """A checked module the writer cannot store: deeper than the format's nesting limit,
    too big, or an AST that does not survive canonical printing (a generated one)."""

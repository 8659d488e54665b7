"""Reading and writing `.loombc` files: a size bound before reading, and atomic replacement when writing
(`write_atomically`, the one writer of `loomc.files`, re-exported here for the callers that import it from here)."""

from __future__ import annotations

import os
from pathlib import Path

from loomc.bytecode.errors import LoomBytecodeError
from loomc.bytecode.format import MAX_FILE_BYTES
from loomc.files import write_atomically


def read_bytecode_file(path: Path) -> bytes:
    """The file's bytes; an oversized file is refused before it is read. OSError if unreadable."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise LoomBytecodeError(f"file is {size} bytes; a .loombc holds at most {MAX_FILE_BYTES}",
                                    MAX_FILE_BYTES)
        data = f.read(MAX_FILE_BYTES + 1)  # a file growing while we read still cannot exceed the bound
    return data


__all__ = ["read_bytecode_file", "write_atomically"]

"""Reading and writing `.loombc` files: a size bound before reading, and atomic replacement when writing."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from loomc.bytecode.errors import LoomBytecodeError
from loomc.bytecode.format import MAX_FILE_BYTES


def read_bytecode_file(path: Path) -> bytes:
    """The file's bytes; an oversized file is refused before it is read. OSError if unreadable."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise LoomBytecodeError(f"file is {size} bytes; a .loombc holds at most {MAX_FILE_BYTES}",
                                    MAX_FILE_BYTES)
        data = f.read(MAX_FILE_BYTES + 1)  # a file growing while we read still cannot exceed the bound
    return data


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then `os.replace` it: readers see the old file or the new one.

    The temporary file is created with mode 0o666 minus the umask, like any new file, so
    the result has ordinary permissions (mkstemp's 0o600 would leak into the output)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

"""Files loomc and loomrt write: the one atomic writer, and the loom cache directory.

`write_atomically` is how every generated file is written: `.loombc` output
(`loomc build`), kernel modules in the kernel cache (`lower/numba.py`, `lower/matmul.py`),
parsed trees (`syntax/parsed.py`) and tokenizers rebuilt from GGUF metadata
(`loomrt.tokenizer`); `sealed`/`unsealed` checksum the cache entries that are unpickled.
`default_cache_dir` is the root of the caches (`<root>/kernels/`, `<root>/parsed/`,
`<root>/tokenizers/`). loomc never imports loomrt, so this module imports nothing of either.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path


def default_cache_dir() -> Path:
    """`$LOOM_CACHE_DIR`, else `~/.cache/loom`."""
    configured = os.environ.get("LOOM_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "loom"


def sealed(payload: bytes, magic: bytes) -> bytes:
    """`payload` behind `magic` and its sha256: how a cache entry that is unpickled when read
    (numba's compiled kernels, parsed trees) is stored, so that a damaged entry is noticed."""
    return magic + hashlib.sha256(payload).digest() + payload


def unsealed(data: bytes, magic: bytes) -> bytes | None:
    """The payload of `sealed(payload, magic)`, or None when `data` is not one or its digest
    does not match: then nothing of it is unpickled."""
    head = len(magic)
    if len(data) < head + 32 or not data.startswith(magic):
        return None
    digest, payload = data[head:head + 32], data[head + 32:]
    return payload if hashlib.sha256(payload).digest() == digest else None


def write_atomically(path: Path, data: bytes | str, *, mode: int = 0o666, parents: bool = False) -> None:
    """Replace `path` with `data` (bytes, or text written as UTF-8) so that a reader sees the old
    file or the new one, never part of one, and a crash leaves one of them, not an empty file.

    A temporary file beside `path` (same directory, so same filesystem) is written, flushed and
    fsynced, then `os.replace`d onto `path`, and the directory is fsynced so the rename itself
    is durable (where the platform can: not on Windows). The file is created with `mode` minus
    the umask, like any new file (`open` uses 0o666 too); `tempfile.mkstemp`'s 0o600 would leak
    into the result. `parents` creates missing directories first (caches); otherwise a missing
    directory is an error (an output path names a directory that exists)."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
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
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # Windows cannot open a directory; the rename is as durable as it gets there
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


__all__ = ["default_cache_dir", "write_atomically"]

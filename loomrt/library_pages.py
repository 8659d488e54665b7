"""Give back the resident pages of a shared library's read-only mappings once nothing runs it.

Loading a model's kernels runs LLVM (numba links each cached kernel's object code through
`libllvmlite`): about 70 MB of its code and read-only data become resident in the serving
process, and stay counted in its RSS although no request ever runs them. Pages of a
read-only file mapping that no one has written are the file's own bytes, so
`madvise(MADV_DONTNEED)` drops them from this process and nothing is lost: the next compile
faults them back in from the page cache (the file stays cached; `MADV_PAGEOUT` would evict it
and make the next start read it from disk).

Linux only (it reads `/proc/self/smaps`); elsewhere it gives back nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from pathlib import Path

SMAPS = Path("/proc/self/smaps")


def _clean_read_only_mappings(library: str, smaps: str) -> list[tuple[int, int]]:
    """(start, length) of every mapping of a file whose name contains `library` that is not
    writable and has no dirty page (a relocated, then protected, RELRO page is dirty: it
    differs from the file and must stay)."""
    found: list[tuple[int, int]] = []
    current: list | None = None
    for line in smaps.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":"):   # a mapping's header: range perms offset dev inode [path]
            low, high = (int(x, 16) for x in fields[0].split("-"))
            path = fields[5] if len(fields) > 5 else ""
            named = Path(path).name.startswith(library) and "w" not in fields[1]
            current = [low, high - low, 0] if named else None
            if current is not None:
                found.append(current)
        elif current is not None and fields[0] in ("Private_Dirty:", "Shared_Dirty:"):
            current[2] += int(fields[1])
    return [(start, length) for start, length, dirty in found if dirty == 0]


def release_library_pages(library: str) -> int:
    """Drop from this process the resident pages of `library`'s clean, read-only mappings;
    the bytes of mappings advised (0 where the system offers no way)."""
    advise = getattr(mmap, "MADV_DONTNEED", None)
    libc_name = ctypes.util.find_library("c")
    if advise is None or libc_name is None or not SMAPS.exists():
        return 0
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    given = 0
    for start, length in _clean_read_only_mappings(library, SMAPS.read_text()):
        if libc.madvise(start, length, advise) == 0:
            given += length
    return given


__all__ = ["release_library_pages"]

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
from dataclasses import dataclass
from pathlib import Path

SMAPS = Path("/proc/self/smaps")


@dataclass
class MappedRegion:
    """One mapping of this process's address space, as /proc/self/smaps describes it."""

    start: int
    length: int
    perms: str
    path: str          # "" for anonymous memory
    rss: int = 0       # bytes resident
    dirty: int = 0     # bytes that differ from the file (private or shared)


def read_mappings(smaps: str) -> list[MappedRegion]:
    """The mappings of an smaps text, in address order."""
    found: list[MappedRegion] = []
    for line in smaps.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":"):   # a mapping's header: range perms offset dev inode [path]
            low, high = (int(x, 16) for x in fields[0].split("-"))
            found.append(MappedRegion(low, high - low, fields[1], fields[5] if len(fields) > 5 else ""))
        elif found and fields[0] == "Rss:":
            found[-1].rss += int(fields[1]) * 1024
        elif found and fields[0] in ("Private_Dirty:", "Shared_Dirty:"):
            found[-1].dirty += int(fields[1]) * 1024
    return found


def _clean_read_only_mappings(library: str, smaps: str) -> list[tuple[int, int]]:
    """(start, length) of every mapping of a file whose name starts with `library` that is not
    writable and has no dirty page (a relocated, then protected, RELRO page is dirty: it
    differs from the file and must stay)."""
    return [(m.start, m.length) for m in read_mappings(smaps)
            if Path(m.path).name.startswith(library) and "w" not in m.perms and m.dirty == 0]


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


__all__ = ["MappedRegion", "SMAPS", "read_mappings", "release_library_pages"]

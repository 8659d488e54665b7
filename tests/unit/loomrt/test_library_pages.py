"""Giving back a library's clean read-only pages: which mappings qualify, and that LLVM keeps
working (and our kernels keep their results) after its pages were dropped."""

import os
import subprocess
import sys
import textwrap

import pytest

from loomrt.library_pages import _clean_read_only_mappings

SMAPS = """\
7f0000000000-7f0000400000 r--p 00000000 fd:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                2048 kB
Private_Clean:      2048 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
7f0000400000-7f0005400000 r-xp 00400000 fd:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:               51200 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
7f0005400000-7f0005500000 r--p 05400000 fd:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Private_Dirty:       512 kB
Shared_Dirty:          0 kB
7f0005500000-7f0005600000 rw-p 05500000 fd:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
7f0006000000-7f0006100000 r-xp 00000000 fd:01 12 /usr/lib/libc.so.6
Rss:                1024 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
7f0007000000-7f0007100000 rw-p 00000000 00:00 0
Rss:                1024 kB
Private_Dirty:      1024 kB
Shared_Dirty:          0 kB
"""


def test_only_the_librarys_clean_read_only_mappings_qualify():
    """The relocated (dirty) read-only page range and the writable data stay; other files and
    anonymous memory are never touched."""
    assert _clean_read_only_mappings("libllvmlite", SMAPS) == [(0x7f0000000000, 0x400000),
                                                              (0x7f0000400000, 0x5000000)]
    assert _clean_read_only_mappings("libtbb", SMAPS) == []


RELEASE_THEN_COMPILE = textwrap.dedent("""
    from pathlib import Path

    import numba, numpy as np
    from loomrt.library_pages import SMAPS, read_mappings, release_library_pages

    def resident(name):
        return sum(m.rss for m in read_mappings(SMAPS.read_text()) if Path(m.path).name.startswith(name))

    first = numba.njit(lambda a: (a * 2.0).sum())
    x = np.arange(1000, dtype=np.float64)
    assert first(x) == 999000.0
    before = resident("libllvmlite")
    given = release_library_pages("libllvmlite")
    after = resident("libllvmlite")
    second = numba.njit(lambda a: (a + 1.0).sum())      # LLVM runs again: its pages fault back in
    print(before, given, after, first(x), second(x))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads resident pages from /proc/self/smaps")
def test_llvm_pages_given_back_and_llvm_still_compiles():
    done = subprocess.run([sys.executable, "-c", RELEASE_THEN_COMPILE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    before, given, after, first, second = done.stdout.split()
    assert int(before) > 20 << 20 and int(given) > 20 << 20        # LLVM's code was resident, and was advised
    assert int(after) < int(before) // 4                            # and is no longer counted
    assert (float(first), float(second)) == (999000.0, 500500.0)    # code compiled before and after

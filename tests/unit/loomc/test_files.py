"""loomc/files.py: the one atomic writer and the loom cache directory."""

import os

import pytest

from loomc import files
from loomc.files import default_cache_dir, write_atomically


def test_writes_bytes_and_text(tmp_path):
    write_atomically(tmp_path / "b.bin", b"\x00\xffdata")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xffdata"
    write_atomically(tmp_path / "t.txt", "é\nline\r\n")
    assert (tmp_path / "t.txt").read_bytes() == "é\nline\r\n".encode("utf-8")  # no newline translation


def test_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.loombc"
    target.write_bytes(b"old")
    write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.loombc"]


def test_mode_is_defined_minus_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomically(tmp_path / "a", b"x")
        write_atomically(tmp_path / "b", b"x", mode=0o600)
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0o600
    assert (tmp_path / "b").stat().st_mode & 0o777 == 0o600


def test_parents(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "missing" / "x.loombc", b"x")
    write_atomically(tmp_path / "kernels" / "deep" / "k.py", "pass\n", parents=True)
    assert (tmp_path / "kernels" / "deep" / "k.py").read_text() == "pass\n"


def test_failure_removes_temporary_and_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "t.json"
    target.write_text("old")

    def broken(fd):
        raise OSError("disk on fire")

    monkeypatch.setattr(files.os, "fsync", broken)
    with pytest.raises(OSError, match="disk on fire"):
        write_atomically(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_file_and_directory_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_mode), real(fd)))
    write_atomically(tmp_path / "x", b"x")
    assert len(synced) == 2 and not os.path.stat.S_ISDIR(synced[0]) and os.path.stat.S_ISDIR(synced[1])


def test_one_writer_and_one_cache_root():
    """The modules that write files and name the cache use these, not copies of their own
    (`default_cache_dir` itself is tested through `loomc.lower.numba` in test_numba_module.py)."""
    from loomc.bytecode import files as bytecode_files
    from loomc.lower import numba

    assert bytecode_files.write_atomically is write_atomically
    assert numba.write_atomically is write_atomically and numba.default_cache_dir is default_cache_dir

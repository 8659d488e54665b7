"""The cache of parsed trees: a file parsed before is read back, never trusted blindly."""

import pickle

import pytest

from loomc.files import sealed, unsealed
from loomc.syntax import parse as parse_mod
from loomc.syntax.diagnostics import LoomSyntaxError
from loomc.syntax.parsed import MAGIC, MIN_CHARS, entry_path

# A file long enough to be kept (MIN_CHARS), with a comment the tree carries
SOURCE = "// doubles\nkernel twice(x: f32[N], out y: f32[N]) {\n    parallel for i in 0..N {\n" + \
         "".join(f"        let a{i} = x[i] * {i}.0\n" for i in range(40)) + "        y[i] = x[i] * 2.0\n    }\n}\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_CACHE_DIR", str(tmp_path))
    return tmp_path / "parsed"


@pytest.fixture
def parses(monkeypatch):
    """The calls that reached the parser itself."""
    calls = []
    real = parse_mod._parse

    def counting(text, path):
        calls.append(path)
        return real(text, path)

    monkeypatch.setattr(parse_mod, "_parse", counting)
    return calls


def test_a_file_parsed_before_is_read_back_equal_with_its_comments(cache, parses):
    assert len(SOURCE) >= MIN_CHARS
    first = parse_mod.parse_module(SOURCE, "twice.loom")
    again = parse_mod.parse_module(SOURCE, "twice.loom")
    assert parses == ["twice.loom"]
    assert again == first and again is not first
    assert [c.text for c in again.comments] == ["// doubles"] and again.source == SOURCE
    assert entry_path(SOURCE, "twice.loom").parent == cache


def test_another_text_or_path_is_parsed_anew(cache, parses):
    parse_mod.parse_module(SOURCE, "twice.loom")
    parse_mod.parse_module(SOURCE, "other.loom")
    parse_mod.parse_module(SOURCE.replace("2.0", "3.0"), "twice.loom")
    assert parses == ["twice.loom", "other.loom", "twice.loom"]


def test_a_corrupt_unsealed_or_foreign_entry_is_parsed_again_and_replaced(cache, parses):
    entry = entry_path(SOURCE, "twice.loom")
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"not a pickle")
    good = parse_mod.parse_module(SOURCE, "twice.loom")
    sealed_good = entry.read_bytes()
    assert unsealed(sealed_good, MAGIC) is not None
    entry.write_bytes(pickle.dumps(good))   # a tree, but not sealed: never unpickled
    assert parse_mod.parse_module(SOURCE, "twice.loom") == good
    entry.write_bytes(sealed_good[:-1] + bytes([sealed_good[-1] ^ 1]))   # one bit off: the digest differs
    assert parse_mod.parse_module(SOURCE, "twice.loom") == good
    other = parse_mod._parse(SOURCE.replace("2.0", "3.0"), "twice.loom")   # sealed, but another file's tree
    entry.write_bytes(sealed(pickle.dumps(other), MAGIC))
    assert parse_mod.parse_module(SOURCE, "twice.loom") == good
    assert len(parses) == 5   # the first parse, three re-parses (and `other`, made here)
    assert entry.read_bytes() == sealed_good


def test_a_file_that_does_not_parse_is_not_kept(cache, parses):
    bad = SOURCE.replace("parallel for", "parallel fr")
    for _ in range(2):
        with pytest.raises(LoomSyntaxError):
            parse_mod.parse_module(bad, "bad.loom")
    assert len(parses) == 2 and not entry_path(bad, "bad.loom").exists()


def test_a_short_text_is_not_kept(cache, parses):
    parse_mod.parse_module("config n: i64 = 4\n", "n.loom")
    assert not cache.exists()

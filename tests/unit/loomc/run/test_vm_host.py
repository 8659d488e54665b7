"""loomc/run/host.py: every host function and conversion, directly and through the VM."""

from __future__ import annotations

import math

import pytest
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from loomc.check import load_files
from loomc.check.intrinsics import CONTROL_CONVERSIONS, CONTROL_HOST
from loomc.lower.vm import compile_program
from loomc.run.errors import PolicyFailure, VmMemoryExceeded, VmRuntimeError
from loomc.run.vm import Vm
from loomc.run.host import INT_BITS, HostContext, HostFunctions, show, type_name, values_equal

H = HostFunctions(HostContext())


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    vocab = {"[UNK]": 0, "<|im_start|>": 1, "hello": 2, "world": 3, "!": 4}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True)])
    return tok


# ---- through the VM ------------------------------------------------------------------------

EVERY_HOST = """
fn every(tok: any) -> list {
    let m = {"a": 1, "b": [2]}
    var xs = [1]
    append(xs, 2)
    return [len("héllo"), keys(m), values(m), has(m, "b"), contains(xs, 2), startswith("abc", "ab"),
        endswith("abc", "bc"), find("abc", "c"), split("a,b", ","), join(["a", "b"], "-"),
        replace("aXbX", "X", "y"), strip("  s "), lower("AbC"), upper("aBc"), slice("hello", 1, 3), xs,
        type_of(m), json_encode(m), json_decode("[1, 2.5, null]"), regex_match("(b+)", "abbc"),
        tokenize(tok, "hello world"), detokenize(tok, [2, 3]), encode_utf8("é"), decode_utf8(b"\\xc3\\xa9"),
        approx(1.0, 1.05, 0.1), min(3, 2), max("a", "b"), abs(-2.5), int("42"), float(1), str(2.5), bool([])]
}

fn rejects() {
    fail(422, "no")
}

fn typed(m: any, k: any) -> bool {
    return has(m, k)
}
"""


def test_every_host_function_runs_through_the_vm(tmp_path, tokenizer):
    path = tmp_path / "host.loom"
    path.write_text(EVERY_HOST, encoding="utf-8")
    program = compile_program(load_files([path]))
    assert set(program.host_names) == set(CONTROL_HOST) | set(CONTROL_CONVERSIONS)
    vm = Vm(program)
    assert vm.call("every", [tokenizer]) == [
        5, ["a", "b"], [1, [2]], True, True, True, True, 2, ["a", "b"], "a-b", "ayby", "s", "abc", "ABC", "el",
        [1, 2], "map", '{"a":1,"b":[2]}', [1, 2.5, None], ["bb", "bb"], [2, 3], "hello world", b"\xc3\xa9", "é",
        True, 2, "b", 2.5, 42, 1.0, "2.5", False]
    with pytest.raises(PolicyFailure) as info:
        vm.call("rejects", [])
    assert info.value.status == 422
    with pytest.raises(VmRuntimeError, match=r"has\(\) argument 2 must be str, got int"):
        vm.call("typed", [{}, 1])
    with pytest.raises(VmRuntimeError, match=r"has\(\) argument 1 must be map, got list"):
        vm.call("typed", [[], "k"])


def test_an_unknown_host_function_is_reported_when_the_vm_is_built():
    with pytest.raises(VmRuntimeError, match="does not have"):
        H.table(("teleport",))


# ---- values ----------------------------------------------------------------------------------


def test_len_and_type_of():
    assert [H.h_len(x) for x in ("é", b"ab", [1, 2, 3], {"a": 1})] == [1, 2, 3, 1]
    for x in (None, 1, 1.5, True):
        with pytest.raises(VmRuntimeError, match="len"):
            H.h_len(x)
    assert [H.h_type_of(x) for x in (None, True, 1, 1.0, "", b"", [], {}, object())] == \
        ["null", "bool", "int", "float", "str", "bytes", "list", "map", "handle"]


def test_keys_values_has_keep_insertion_order():
    m = {"z": 1, "a": 2}
    assert H.h_keys(m) == ["z", "a"] and H.h_values(m) == [1, 2] and H.h_has(m, "a") and not H.h_has(m, "b")
    keys = H.h_keys(m)
    keys.append("x")
    assert list(m) == ["z", "a"]  # a new list


def test_contains():
    assert H.h_contains("hello", "ell") and not H.h_contains("hello", "xyz")
    assert H.h_contains([1, [2]], [2]) and not H.h_contains([1], 1.0) and not H.h_contains([True], 1)
    assert not H.h_contains([math.nan], math.nan)
    assert H.h_contains({"k": 1}, "k") and not H.h_contains({"k": 1}, "v")
    assert H.h_contains(b"\x00\x01", 1) and H.h_contains(b"abc", b"bc") and not H.h_contains(b"a", 300)
    for haystack, needle in [("s", 1), ({}, 1), (b"", "x"), (1, 1), (None, "x")]:
        with pytest.raises(VmRuntimeError, match="contains"):
            H.h_contains(haystack, needle)


def test_slice_clamps_its_bounds():
    assert H.h_slice("hello", 1, 3) == "el"
    assert H.h_slice("hello", -5, 2) == "he"
    assert H.h_slice("hello", 3, 99) == "lo"
    assert H.h_slice("hello", 4, 1) == ""
    assert H.h_slice(b"abc", 1, 2) == b"b"
    xs = [1, 2, 3]
    part = H.h_slice(xs, 0, 2)
    part.append(9)
    assert xs == [1, 2, 3]
    with pytest.raises(VmRuntimeError, match="slice"):
        H.h_slice({}, 0, 1)


def test_append_mutates_in_place_and_is_bounded():
    xs: list = []
    assert H.h_append(xs, 1) is None and xs == [1]
    small = HostFunctions(HostContext(max_value_bytes=16))
    ys = [1, 2]
    with pytest.raises(VmMemoryExceeded):
        small.h_append(ys, 3)


def test_min_max_abs():
    assert (H.h_min(3, 2), H.h_max(3, 2), H.h_min("b", "a"), H.h_max(1.5, 2.5)) == (2, 3, "a", 2.5)
    assert (H.h_abs(-3), H.h_abs(-2.5)) == (3, 2.5)
    for a, b in [(1, 1.0), (True, False), ([1], [2]), (None, 1)]:
        with pytest.raises(VmRuntimeError, match="expected two ints"):
            H.h_min(a, b)
    with pytest.raises(VmRuntimeError, match="abs"):
        H.h_abs("x")


def test_approx_is_absolute():
    assert H.h_approx(1.0, 1.0000001, 1e-6) and not H.h_approx(1000.0, 1000.1, 1e-6)
    assert H.h_approx(math.inf, math.inf, 0.0) and not H.h_approx(math.nan, math.nan, 1.0)


def test_fail_validates_its_status():
    with pytest.raises(PolicyFailure) as info:
        H.h_fail(400, "bad temperature")
    assert (info.value.status, info.value.message) == (400, "bad temperature")
    for status in (200, 399, 600):
        with pytest.raises(VmRuntimeError, match="400..599"):
            H.h_fail(status, "x")


# ---- strings and bytes ----------------------------------------------------------------------


def test_string_functions():
    assert H.h_startswith("abc", "") and H.h_endswith("abc", "c") and not H.h_startswith("abc", "b")
    assert (H.h_find("héllo", "l"), H.h_find("abc", "z")) == (2, -1)
    assert H.h_split("a,,b", ",") == ["a", "", "b"] and H.h_split("", ",") == [""]
    with pytest.raises(VmRuntimeError, match="empty separator"):
        H.h_split("abc", "")
    assert H.h_join([], ",") == "" and H.h_join(["a"], ",") == "a"
    with pytest.raises(VmRuntimeError, match="every element must be a str"):
        H.h_join(["a", 1], ",")
    assert H.h_replace("aaa", "a", "bb") == "bbbbbb" and H.h_replace("ab", "", "-") == "-a-b-"
    assert H.h_strip("\t x \n") == "x" and H.h_lower("ÀB") == "àb" and H.h_upper("straße") == "STRASSE"


def test_string_results_are_bounded_before_they_are_built():
    small = HostFunctions(HostContext(max_value_bytes=100))
    with pytest.raises(VmMemoryExceeded):
        small.h_replace("a" * 50, "a", "xyz")
    with pytest.raises(VmMemoryExceeded):
        small.h_join(["x" * 60, "y" * 60], "")
    with pytest.raises(VmMemoryExceeded):
        HostFunctions(HostContext(max_value_bytes=8)).h_split(",,", ",")  # room for one element
    with pytest.raises(VmMemoryExceeded):
        small.h_upper("ß" * 60)


def test_utf8_round_trip_and_replacement():
    assert H.h_encode_utf8("é€") == "é€".encode()
    assert H.h_decode_utf8(b"\xc3\xa9") == "é"
    assert H.h_decode_utf8(b"a\xffb") == "a\ufffdb"
    assert H.h_encode_utf8("a\ud800") == b"a?"


def test_regex_match():
    assert H.h_regex_match(r"(\w+)=(\d+)", "x: temp=42;") == ["temp=42", "temp", "42"]
    assert H.h_regex_match(r"^a(b)?", "ac") == ["a", None]
    assert H.h_regex_match(r"^z", "az") is None
    with pytest.raises(VmRuntimeError, match="pattern is invalid"):
        H.h_regex_match("(", "x")
    with pytest.raises(VmRuntimeError, match="at most 1000"):
        H.h_regex_match("a" * 1001, "a")
    assert HostFunctions(HostContext(max_regex_pattern_chars=2)).h_regex_match("ab", "ab") == ["ab"]


# ---- JSON --------------------------------------------------------------------------------------


def test_json_encode_is_compact_and_strict():
    assert H.h_json_encode({"b": [1, 2.5, True, None], "a": "é"}) == '{"b":[1,2.5,true,null],"a":"é"}'
    for bad, message in [(math.nan, "not JSON"), ([math.inf], "not JSON"), (b"x", "bytes is not JSON"),
                         ({"k": object()}, "handle is not JSON")]:
        with pytest.raises(VmRuntimeError, match=message):
            H.h_json_encode(bad)
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(VmRuntimeError, match="nested more than"):
        H.h_json_encode(cyclic)


def test_json_encode_bounds_shared_structure_before_encoding():
    x: list = ["y" * 1000]
    for _ in range(40):
        x = [x, x]  # 2^40 leaves, but only 41 distinct lists
    with pytest.raises(VmMemoryExceeded):
        HostFunctions(HostContext(max_value_bytes=1 << 20)).h_json_encode(x)


def test_json_decode_is_strict_and_answers_null_for_invalid_text():
    assert H.h_json_decode('{"a": [1, -2.5e3, "\\u00e9\\ud83d\\ude00"], "b": null}') == \
        {"a": [1, -2500.0, "é😀"], "b": None}
    assert H.h_json_decode("null") is None and H.h_json_decode("12") == 12
    for bad in ['{"a": 1, "a": 2}', "NaN", "[Infinity]", "[-Infinity]", "1e400", "[1,]", "{'a': 1}", "1 2", "",
                '"\\ud800"', "9" * 1300, "[" * 5000 + "]" * 5000]:
        assert H.h_json_decode(bad) is None, bad


# ---- conversions ---------------------------------------------------------------------------


def test_int_conversion():
    assert [H.h_int(x) for x in (7, True, -2.7, 2.7, "-15", "+3", "007")] == [7, 1, -2, 2, -15, 3, 7]
    for bad in (math.nan, math.inf, "1.5", " 1", "1_000", "", "0x10", None, [1], b"1", "9" * 2000):
        with pytest.raises(VmRuntimeError, match="int()"):
            H.h_int(bad)
    with pytest.raises(VmRuntimeError, match="overflow"):
        H.h_int("9" * 1300)  # about 2^4318


def test_float_conversion():
    assert [H.h_float(x) for x in (2, False, 1.5, "1.5", "-2e3", ".5", "3.")] == [2.0, 0.0, 1.5, 1.5, -2000.0, 0.5,
                                                                                 3.0]
    for bad in ("nan", "inf", "1e999", "1,5", "", None, [1.0]):
        with pytest.raises(VmRuntimeError, match="float()"):
            H.h_float(bad)
    with pytest.raises(VmRuntimeError, match="too large"):
        H.h_float(2 ** (INT_BITS - 1))


def test_str_conversion():
    assert [H.h_str(x) for x in (None, True, False, 42, 0.1, 1.0, 1e20, math.inf, "s", [1, "a"], {"k": None})] == \
        ["null", "true", "false", "42", "0.1", "1.0", "1e+20", "inf", "s", '[1,"a"]', '{"k":null}']
    with pytest.raises(VmRuntimeError, match="decode_utf8"):
        H.h_str(b"x")
    with pytest.raises(VmRuntimeError):
        H.h_str(object())


def test_bool_conversion():
    falsy = [None, 0, 0.0, "", b"", [], {}, False]
    truthy = [1, -0.5, "0", b"\x00", [0], {"": 0}, True]
    assert [H.h_bool(x) for x in falsy] == [False] * len(falsy)
    assert [H.h_bool(x) for x in truthy] == [True] * len(truthy)
    with pytest.raises(VmRuntimeError):
        H.h_bool(object())


# ---- tokenizers ----------------------------------------------------------------------------------


def test_tokenize_and_detokenize_with_a_real_tokenizer(tokenizer):
    ids = H.h_tokenize(tokenizer, "<|im_start|>hello world! zzz")
    assert ids == [1, 2, 3, 4, 0]  # the special token is matched in the text; no BOS/EOS is added
    assert H.h_detokenize(tokenizer, [1, 2, 3]) == "<|im_start|> hello world"  # specials kept
    assert H.h_detokenize(tokenizer, []) == ""
    for bad in ([-1], [1.0], ["2"], [2 ** 40]):
        with pytest.raises(VmRuntimeError, match="ids must be ints"):
            H.h_detokenize(tokenizer, bad)
    for handle in (None, "tok", {"encode": 1}, 3):
        with pytest.raises(VmRuntimeError, match="needs a tokenizer handle"):
            H.h_tokenize(handle, "x")


def test_tokenizer_failures_become_runtime_errors():
    class Broken:
        def encode(self, text, add_special_tokens):
            raise RuntimeError("kaput")

        def decode(self, ids, skip_special_tokens):
            raise RuntimeError("kaput")

    with pytest.raises(VmRuntimeError, match="tokenize\\(\\) failed: kaput"):
        H.h_tokenize(Broken(), "x")
    with pytest.raises(VmRuntimeError, match="detokenize\\(\\) failed: kaput"):
        H.h_detokenize(Broken(), [1])


# ---- helpers ---------------------------------------------------------------------------------


def test_show_renders_short_control_syntax():
    assert show([None, True, 1, 1.5, "a\n", b"\x00", {"k": []}]) == \
        '[null, true, 1, 1.5, "a\\n", b"\\u0000", {"k": []}]'
    assert show("x" * 500).endswith("...") and len(show("x" * 500)) == 80
    assert show(2 ** 1000) == "<1001-bit int>" and show(object()) == "<object>"


def test_values_equal_and_type_name():
    assert values_equal({"a": [1]}, {"a": [1]}) and not values_equal([1], (1,)) and type_name((1,)) == "handle"

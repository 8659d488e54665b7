"""loomc.strict_json: the one strict decoder (documents, control code, request bodies)."""

import pytest

from loomc.strict_json import StrictJsonError, loads


def test_plain_json_decodes():
    assert loads('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}


@pytest.mark.parametrize("text,fragment", [
    ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ("[NaN]", "NaN is not JSON"),
    ("[Infinity]", "Infinity is not JSON"),
    ("[1e999]", "out of range"),
    ('["\\ud800"]', "lone UTF-16 surrogate"),
    ('{"a": }', "Expecting value"),
])
def test_rejections(text, fragment):
    with pytest.raises(StrictJsonError, match=fragment):
        loads(text)


def test_syntax_errors_keep_their_position():
    with pytest.raises(StrictJsonError) as info:
        loads('{\n  "a": }')
    assert (info.value.lineno, info.value.colno) == (2, 8)


def test_integer_limit_is_optional():
    assert loads("[18446744073709551616]") == [2**64]
    with pytest.raises(StrictJsonError, match="out of range"):
        loads("[18446744073709551616]", int_limit=2**64)


def test_a_paired_surrogate_is_fine():
    assert loads('["\\ud83d\\ude00"]') == ["\U0001F600"]


def test_a_lone_surrogate_deep_inside_nesting_json_accepts_is_refused_not_a_recursion_error():
    """Found by bench/fuzz.py: 500 levels of objects decode, and the surrogate walk that followed
    recursed two frames per level (RecursionError, a 500 from the daemon)."""
    text = '{"a":' * 500 + '"\\ud800"' + "}" * 500
    with pytest.raises(StrictJsonError, match="lone UTF-16 surrogate|nested too deeply"):
        loads(text)

"""loomd/params.py: header and query integers are plain decimals, the whole string."""

from __future__ import annotations

import pytest

from loomd.params import is_decimal, one_decimal
from loomrt.errors import InvalidRequest


@pytest.mark.parametrize("text", ["0", "7", "64", "123456789012345678"])
def test_plain_decimals(text):
    assert is_decimal(text)


@pytest.mark.parametrize("text", ["", "-1", "+1", "01", "1_000", " 1", "1 ", "1\n", "\n1", "١", "1.0",
                                  "1234567890123456789"])
def test_everything_else_is_not_a_decimal(text):
    assert not is_decimal(text)


def test_one_decimal_rejects_a_trailing_newline_and_repeats():
    assert one_decimal(["5"], "X-Loom-Offset") == 5
    for values in (["5\n"], ["5", "5"], []):
        with pytest.raises(InvalidRequest):
            one_decimal(values, "X-Loom-Offset")

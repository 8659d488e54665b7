"""pack_rows: the arrays of one packed step, as its module docstring draws them."""

from __future__ import annotations

import numpy as np

from loomrt.services.packing import NO_PAGE, TokenRow, pack_rows


def test_pack_rows_matches_the_documented_layout():
    rows = [TokenRow("a", (11, 12, 13), 7, (4, 9)), TokenRow("b", (21,), 30, (2, 5, 6))]
    packed = pack_rows(rows, pages_per_row=4)
    assert {k: v.dtype for k, v in packed.items()} == dict.fromkeys(
        ("tokens", "positions", "rows", "last", "page_table"), np.dtype(np.int32))
    assert packed["tokens"].tolist() == [11, 12, 13, 21]
    assert packed["positions"].tolist() == [7, 8, 9, 30]
    assert packed["rows"].tolist() == [0, 0, 0, 1]
    assert packed["last"].tolist() == [2, 3]
    assert packed["page_table"].tolist() == [[4, 9, NO_PAGE, NO_PAGE], [2, 5, 6, NO_PAGE]]


def test_pack_rows_without_a_width_takes_the_longest_row_and_packs_nothing_to_empty_arrays():
    packed = pack_rows([TokenRow(None, (1,), 0, (3,)), TokenRow(None, (2, 3), 5, (0, 1))])
    assert packed["page_table"].tolist() == [[3, NO_PAGE], [0, 1]]
    empty = pack_rows([], pages_per_row=8)
    assert empty["page_table"].shape == (0, 8)
    assert all(empty[k].shape == (0,) for k in ("tokens", "positions", "rows", "last"))

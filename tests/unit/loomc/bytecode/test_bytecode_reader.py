"""The reader refuses each kind of malformed input with a message and the offset where it found it."""

from __future__ import annotations

import struct

import pytest

from bytecode_testlib import replace_section, reseal, sections, table_end
from loomc.bytecode import LoomBytecodeError, read_bytecode_file, read_module, write_module
from loomc.bytecode.cursor import Cursor
from loomc.bytecode.format import HEADER_BYTES, MAX_DEPTH, MAX_FILE_BYTES, Section
from loomc.bytecode.varint import uvarint
from loomc.bytecode.writer import encode_items, pack
from loomc.syntax import ast
from loomc.syntax.parse import parse_module

SOURCE = 'use "lib.loom" { a }\nconfig n: i64 = 1 + 2\nfn f(x: int) -> int {\n    return x * n\n}\n'


@pytest.fixture(scope="module")
def data() -> bytes:
    return write_module(parse_module(SOURCE))


def rejected(data: bytes) -> LoomBytecodeError:
    with pytest.raises(LoomBytecodeError) as info:
        read_module(data, "t.loombc")
    exc = info.value
    assert 0 <= exc.offset <= len(data)
    assert str(exc) == f"{exc.message} at byte {exc.offset}"
    return exc


def fn_with(*stmts: ast.Stmt) -> bytes:
    return encode_items([ast.Fn("f", [], None, ast.Block(list(stmts)))])


def n(v: int) -> ast.IntLit:
    return ast.IntLit(v, str(v))


# ---- header and container -----------------------------------------------------------------------------


def test_bad_magic(data):
    assert rejected(b"junk" + data[4:]).offset == 0
    assert "not a .loombc file" in rejected(b"fn f() {}\n").message


def test_truncated_header(data):
    exc = rejected(data[:10])
    assert exc.offset == 10 and "truncated header" in exc.message


def test_version_mismatch(data):
    exc = rejected(data[:4] + struct.pack("<H", 2) + data[6:])
    assert exc.offset == 4 and "version 2" in exc.message


def test_reserved_flags(data):
    assert rejected(data[:6] + b"\x01\x00" + data[8:]).offset == 6


def test_truncated_body(data):
    exc = rejected(data[:-1])
    assert exc.offset == 8 and "truncated" in exc.message


def test_checksum(data):
    exc = rejected(data[:-1] + bytes([data[-1] ^ 1]))
    assert exc.offset == 12 and "checksum" in exc.message


def test_oversized_input_is_refused_before_decoding():
    assert "at most" in rejected(b"\0" * (MAX_FILE_BYTES + 1)).message


def test_oversized_file_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.loombc"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is allocated
    with pytest.raises(LoomBytecodeError, match="at most"):
        read_bytecode_file(big)


def _table(entries: list[tuple[int, int, int]]) -> bytes:
    return uvarint(len(entries)) + b"".join(uvarint(a) + uvarint(b) + uvarint(c) for a, b, c in entries)


def _with_table(data: bytes, edit) -> bytes:
    parts = sections(data)
    entries, at = [], 0
    for sid, blob in parts:
        entries.append((sid, at, len(blob)))
        at += len(blob)
    return reseal(data[:HEADER_BYTES] + _table(edit(entries)) + data[table_end(data):])


@pytest.mark.parametrize("edit,message", [
    (lambda e: e + [(9, 0, 0)], "unknown section id 9"),
    (lambda e: e + [e[0]], "duplicate strings section"),
    (lambda e: e[1:], "missing strings section"),
    (lambda e: [e[0], (e[1][0], e[1][1] - 1, e[1][2])] + e[2:], "overlaps"),
    (lambda e: [e[0], (e[1][0], e[1][1] + 1, e[1][2] - 1)] + e[2:], "belong to no section"),
    (lambda e: e[:-1] + [(e[-1][0], e[-1][1], e[-1][2] - 1)], "after the last section"),
    (lambda e: e[:-1] + [(e[-1][0], e[-1][1], 2**63)], "runs past the end"),
    (lambda e: e * 3, "sections; a .loombc has at most"),
])
def test_section_table(data, edit, message):
    assert message in rejected(_with_table(data, edit)).message


def test_non_minimal_and_overlong_varints(data):
    count_at = HEADER_BYTES
    padded = reseal(data[:count_at] + b"\x86\x00" + data[count_at + 1:])  # 6 as two bytes
    assert "not minimally encoded" in rejected(padded).message
    overlong = reseal(data[:count_at] + b"\xff" * 11 + b"\x01" + data[count_at + 1:])
    assert "longer than 10 bytes" in rejected(overlong).message
    too_big = reseal(data[:count_at] + b"\xff" * 9 + b"\x7f" + data[count_at + 1:])
    assert "does not fit in 64 bits" in rejected(too_big).message


# ---- tables -------------------------------------------------------------------------------------------


def test_counts_are_bounded_by_the_bytes_that_remain(data):
    exc = rejected(replace_section(data, Section.STRINGS, uvarint(2**40) + b"\x00"))
    assert exc.message == f"string count: {2**40} claimed, but only 1 bytes remain in the strings section"


def test_invalid_utf8(data):
    assert "not valid UTF-8" in rejected(replace_section(data, Section.STRINGS, b"\x01\x02\xc3\x28")).message


def test_string_index_out_of_range(data):
    strings = sections(data)[0][1]
    fewer = uvarint(1) + strings[1:1 + 1 + strings[1]]  # keep only the first string
    assert "out of range" in rejected(replace_section(data, Section.STRINGS, fewer)).message


def test_trailing_bytes_in_a_section(data):
    blob = dict(sections(data))[Section.SYMBOLS]
    assert "unused bytes at the end of the symbols section" in rejected(
        replace_section(data, Section.SYMBOLS, blob + b"\x00")).message


def test_source_locations_must_match_the_nodes(data):
    blob = dict(sections(data))[Section.LOCATIONS]
    cur = Cursor(blob, 0, len(blob), "locations")
    count, spans = cur.uvarint("count"), blob[cur.pos:]
    more = uvarint(count + 1) + spans + b"\x00" * 4
    assert "belong to no node" in rejected(replace_section(data, Section.LOCATIONS, more)).message
    fewer = uvarint(count - 1) + spans[:-4]  # the last span is four one-byte varints
    assert "no source location left" in rejected(replace_section(data, Section.LOCATIONS, fewer)).message


def test_symbol_code_offsets_must_agree_with_the_code(data):
    symbols = bytearray(dict(sections(data))[Section.SYMBOLS])
    symbols[-1] += 1  # the last item's code offset
    assert "says its code starts at" in rejected(replace_section(data, Section.SYMBOLS, bytes(symbols))).message


def test_symbol_kind_must_be_an_item(data):
    symbols = bytearray(dict(sections(data))[Section.SYMBOLS])
    symbols[1] = 48  # Let
    assert "expected an item kind, found tag 48 (Let)" in rejected(
        replace_section(data, Section.SYMBOLS, bytes(symbols))).message


# ---- nodes ----------------------------------------------------------------------------------------------


def test_wrong_child_kind():
    bad = ast.Binary("+", ast.Let("x", None, n(1)), n(2))  # a statement where an expression must be
    assert "expected an expression, found tag 48 (Let)" in rejected(fn_with(ast.ExprStmt(bad))).message


def test_unknown_tag(data):
    code = bytearray(dict(sections(data))[Section.CODE])
    i = code.index(bytes([24]))  # the Binary tag of `1 + 2`
    code[i] = 120
    assert "unknown tag 120" in rejected(replace_section(data, Section.CODE, bytes(code))).message


def test_nesting_depth_is_bounded():
    expr: ast.Expr = n(1)
    for _ in range(MAX_DEPTH + 5):
        expr = ast.Paren(expr)
    data = encode_items([ast.Config("c", ast.ScalarTypeRef("i64"), expr)], max_depth=10**4)
    assert "deeper than 256" in rejected(data).message


def test_the_writer_refuses_what_the_reader_would():
    from loomc.bytecode import LoomBytecodeEncodeError

    # The parser stops at 200 levels (L0109), so a deeper tree can only be built by hand.
    def chain(depth: int) -> ast.Expr:
        e: ast.Expr = n(1)
        for _ in range(depth):
            e = ast.Binary("+", e, n(1))
        return e

    deep = ast.Module("deep.loom", [ast.Config("c", ast.ScalarTypeRef("i64"), chain(MAX_DEPTH + 1))])
    with pytest.raises(LoomBytecodeEncodeError, match="nesting deeper than 200"):
        write_module(deep)
    ok = "config c: i64 = " + " + ".join(["1"] * 150) + "\n"
    assert read_module(write_module(parse_module(ok)), "ok.loombc").items == parse_module(ok).items


@pytest.mark.parametrize("item,message", [
    (ast.Config("let", ast.ScalarTypeRef("i64"), n(1)), "'let' is a reserved word"),
    (ast.Config("a b", ast.ScalarTypeRef("i64"), n(1)), "'a b' is not a name"),
    (ast.Config("c", ast.ScalarTypeRef("i64"), ast.IntLit(1, "one")), "is not int literal text"),
    (ast.Config("c", ast.ScalarTypeRef("u64"), ast.IntLit(0, "18446744073709551616")), "does not fit in 64 bits"),
    (ast.Config("c", ast.ScalarTypeRef("i64"), ast.IntLit(0, "0" * 5000 + "1")), None),
    (ast.Config("c", ast.DynTypeRef("str"), ast.StrLit("", '"\\q"')), "invalid escape"),
    (ast.Config("c", ast.ScalarTypeRef("i64"), ast.Index(ast.Name("x"), [])), "needs at least 1"),
    (ast.Param("p", None, ast.TensorTypeRef("f32", []), n(1)), "needs at least 1"),
])
def test_names_literals_and_counts_the_parser_would_refuse(item, message):
    data = encode_items([item])
    if message is None:  # a long zero-padded literal is fine: its value is 1
        assert read_module(data, "t.loombc").items[0].value.value == 1
    else:
        assert message in rejected(data).message


@pytest.mark.parametrize("expr,message", [
    (ast.Binary("*", ast.Binary("+", n(1), n(2)), n(3)), "left operand of '*'"),
    (ast.Binary("-", n(1), ast.Binary("-", n(2), n(3))), "right operand of '-'"),
    (ast.Binary("<", ast.Binary("<", n(1), n(2)), n(3)), "left operand of '<'"),
    (ast.Unary("-", ast.Binary("+", n(1), n(2))), "operand of unary '-'"),
    (ast.Call(ast.Unary("-", ast.Name("f")), []), "a callee needs parentheses"),
    (ast.Index(ast.Binary("+", n(1), n(2)), [n(0)]), "an indexed value needs parentheses"),
])
def test_operands_that_would_reparse_differently(expr, message):
    assert message in rejected(fn_with(ast.ExprStmt(ast.Call(ast.Name("g"), [expr])))).message


@pytest.mark.parametrize("first,second,message", [
    (ast.ExprStmt(ast.Name("a")), ast.ExprStmt(ast.Paren(ast.Name("b"))), "starts with '('"),
    (ast.Let("x", None, n(1)), ast.ExprStmt(ast.Unary("-", ast.Name("b"))), "starts with '-'"),
    (ast.Var("x", ast.ScalarTypeRef("f32"), None), ast.ExprStmt(ast.Index(ast.ListLit([]), [n(0)])),
     "make the type before it a tensor type"),
    (ast.Return(None), ast.Assign(ast.Name("a"), "=", n(1)), "bare `return`"),
])
def test_statements_that_would_merge(first, second, message):
    assert message in rejected(fn_with(first, second)).message
    assert read_module(fn_with(second, first), "t.loombc")  # the other order is fine


def test_statement_pairs_that_are_fine():
    read_module(fn_with(ast.Var("x", None, None), ast.ExprStmt(ast.Paren(ast.Name("b")))), "t.loombc")
    read_module(fn_with(ast.Var("x", ast.DynTypeRef("int"), None), ast.ExprStmt(ast.ListLit([]))), "t.loombc")
    read_module(fn_with(ast.Break(), ast.ExprStmt(ast.Unary("-", n(1)))), "t.loombc")


def test_a_table_built_by_hand_reads():
    """`pack` is the whole container format: sections in any table order are fine."""
    parts = sections(write_module(parse_module(SOURCE)))
    assert read_module(pack(parts[::-1]), "t.loombc").items == parse_module(SOURCE).items


def test_a_retired_type_code_is_refused_by_name():
    # q4_1x4's code stays taken after its type was retired: a file from before still reads up
    # to it, then names what it was
    item = parse_module("config x: q4_1x16[16] = 0\n").items[0]
    item.type.dtype = "retired q4_1x4"
    exc = rejected(encode_items([item]))
    assert "the retired q4_1x4, which this compiler no longer has" in exc.message

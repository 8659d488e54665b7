"""loomd.multipart: strict multipart/form-data parsing into ordered parts (no sockets)."""

from __future__ import annotations

import pytest

from loomd.multipart import MAX_PARTS, Part, boundary_of, parse_header_params, parse_multipart
from loomrt.errors import InvalidRequest

CT = "multipart/form-data; boundary=XyZ"


def body(*parts: bytes, preamble: bytes = b"", epilogue: bytes = b"\r\n") -> bytes:
    return preamble + b"".join(b"--XyZ\r\n" + p + b"\r\n" for p in parts) + b"--XyZ--" + epilogue


def field(name: str, data: bytes, *extra: str, filename: str | None = None) -> bytes:
    disposition = f'Content-Disposition: form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return "\r\n".join([disposition, *extra]).encode() + b"\r\n\r\n" + data


def rejects(data: bytes, match: str, content_type: str = CT) -> None:
    with pytest.raises(InvalidRequest, match=match) as info:
        parse_multipart(data, content_type)
    assert info.value.status == 400


# ---------------------------------------------------------------- header parameters

def test_header_params_split_type_and_parameters():
    assert parse_header_params('form-data; name="file"; filename="a b.loom"') == (
        "form-data", {"name": "file", "filename": "a b.loom"})
    assert parse_header_params("Multipart/Form-Data ; Boundary=abc") == ("multipart/form-data", {"boundary": "abc"})
    assert parse_header_params("form-data") == ("form-data", {})
    assert parse_header_params("form-data;") == ("form-data", {})
    assert parse_header_params('form-data; name = "x" ;') == ("form-data", {"name": "x"})


def test_quoted_strings_unescape_quotes_and_backslashes():
    kind, params = parse_header_params(r'form-data; name="file"; filename="say \"hi\" \\ done.loom"')
    assert params["filename"] == 'say "hi" \\ done.loom'
    assert parse_header_params('form-data; filename="a;b=c"')[1] == {"filename": "a;b=c"}
    assert parse_header_params('form-data; filename=""')[1] == {"filename": ""}


def test_filenames_are_literal_utf8_not_url_decoded():
    assert parse_header_params('form-data; filename="ünï/%41.loom"')[1]["filename"] == "ünï/%41.loom"


@pytest.mark.parametrize("value", ["form-data; filename*=UTF-8''a%20b.loom", "form-data; name*=x",
                                   "form-data; filename=\"a\"; filename*=UTF-8''b"])
def test_encoded_parameters_are_refused(value):
    with pytest.raises(InvalidRequest, match="encoded parameter"):
        parse_header_params(value)


@pytest.mark.parametrize("value", ['form-data; name="a"; name="b"', "form-data; name=a; NAME=a",
                                   'form-data; filename="x"; filename="x"'])
def test_a_parameter_named_twice_is_refused(value):
    with pytest.raises(InvalidRequest, match="appears twice"):
        parse_header_params(value)


@pytest.mark.parametrize("value, match", [
    ('form-data; name="unterminated', "unterminated"),
    ("form-data; name", "no value"),
    ("form-data; name=", "bad value"),
    ("form-data; name=a b", "unexpected"),
    ("form-data; =x", "bad parameter"),
    ('form-data; name="a"x', "unexpected"),
])
def test_malformed_parameters_are_refused(value, match):
    with pytest.raises(InvalidRequest, match=match):
        parse_header_params(value)


@pytest.mark.parametrize("content_type", ["multipart/form-data", 'multipart/form-data; boundary=""',
                                          "multipart/form-data; boundary=" + "b" * 71,
                                          'multipart/form-data; boundary="ends with space "'])
def test_a_missing_or_invalid_boundary_is_refused(content_type):
    with pytest.raises(InvalidRequest, match="boundary"):
        boundary_of(content_type)


def test_boundary_of_accepts_quoted_and_maximal_boundaries():
    assert boundary_of('multipart/form-data; boundary="a b:c"') == "a b:c"
    assert boundary_of("multipart/form-data; boundary=" + "b" * 70) == "b" * 70
    with pytest.raises(InvalidRequest, match="expected multipart/form-data"):
        boundary_of("multipart/mixed; boundary=abc")


# ---------------------------------------------------------------- parts

def test_parts_keep_their_order_names_filenames_and_types():
    data = body(field("file", b"one", filename="m/b.loom"), field("request", b"{}", "Content-Type: application/json"),
                field("file", b"two", "Content-Type: application/octet-stream", filename="m/a.loom"))
    assert parse_multipart(data, CT) == [
        Part("file", "m/b.loom", None, b"one"),
        Part("request", None, "application/json", b"{}"),
        Part("file", "m/a.loom", "application/octet-stream", b"two"),
    ]


def test_binary_data_with_crlfs_and_boundary_lookalikes_is_kept_exactly():
    # everything but CRLF "--XyZ" (a delimiter by definition) may occur inside a part
    payload = bytes(range(256)) + b"\r\n\r\nx--XyZ\r\n-XyZ\r\n--Xy\r\n\n--XyZ\r--XyZ\r\n" + b"\x00\r" * 7 + b"\r\n"
    data = body(field("file", payload, filename="a.loombc"), field("file", b"\r\n", filename="crlf"),
                field("file", b"", filename="empty"))
    parts = parse_multipart(data, CT)
    assert [p.data for p in parts] == [payload, b"\r\n", b""]


def test_a_quoted_filename_with_escaped_quotes_survives():
    data = body(b'Content-Disposition: form-data; name="file"; filename="a \\"quoted\\" name.loom"\r\n\r\nx')
    assert parse_multipart(data, CT)[0].filename == 'a "quoted" name.loom'


def test_header_names_are_case_insensitive_and_values_trimmed():
    data = body(b'content-DISPOSITION:   form-data; name="x"  \r\nCONTENT-TYPE:text/plain\r\n\r\nv')
    assert parse_multipart(data, CT) == [Part("x", None, "text/plain", b"v")]


def test_preamble_is_ignored():
    data = body(field("a", b"1"), preamble=b"This is a preamble.\r\nIt says --XyZ-ish things.\r\n")
    assert parse_multipart(data, CT) == [Part("a", None, None, b"1")]


@pytest.mark.parametrize("epilogue", [b"", b"\r\n", b"\r\nan epilogue\r\n--XyZ\r\nnot a part", b"  \t\r\n"])
def test_epilogue_after_the_closing_delimiter_is_ignored(epilogue):
    assert parse_multipart(body(field("a", b"1"), epilogue=epilogue), CT) == [Part("a", None, None, b"1")]


def test_transport_padding_after_a_delimiter_is_allowed():
    data = b"--XyZ  \t\r\n" + field("a", b"1") + b"\r\n--XyZ \r\n" + field("b", b"2") + b"\r\n--XyZ--"
    assert [p.name for p in parse_multipart(data, CT)] == ["a", "b"]


def test_quoted_boundary_in_the_content_type():
    data = b'--a b\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--a b--\r\n'
    assert parse_multipart(data, 'multipart/form-data; boundary="a b"') == [Part("a", None, None, b"1")]


def test_no_parts_is_an_empty_list():
    assert parse_multipart(b"--XyZ--\r\n", CT) == []


def test_many_parts_up_to_the_limit():
    parts = parse_multipart(body(*[field("file", b"%d" % i, filename=f"f{i}") for i in range(MAX_PARTS)]), CT)
    assert len(parts) == MAX_PARTS and parts[-1].data == b"%d" % (MAX_PARTS - 1)
    rejects(body(*[field("file", b"", filename=f"f{i}") for i in range(MAX_PARTS + 1)]), "more than")


# ---------------------------------------------------------------- refusals

def test_data_after_the_closing_boundary_is_refused():
    rejects(body(field("a", b"1"), epilogue=b"garbage"), "after the closing boundary")
    rejects(body(field("a", b"1"), epilogue=b"--XyZ\r\n"), "after the closing boundary")


@pytest.mark.parametrize("cut", [1, 5, 9, 30])
def test_a_body_cut_short_is_refused(cut):
    data = body(field("a", b"payload"), field("b", b"more"))
    rejects(data[:-cut], "truncated|bad boundary line|after the closing boundary")


def test_no_closing_delimiter_is_refused():
    rejects(b"--XyZ\r\n" + field("a", b"1") + b"\r\n", "truncated")
    rejects(b"--XyZ\r\n" + field("a", b"1"), "truncated")


def test_no_opening_delimiter_is_refused():
    rejects(b"just some bytes", "no opening boundary")
    rejects(b"", "no opening boundary")
    rejects(body(field("a", b"1")), "no opening boundary", "multipart/form-data; boundary=other")


def test_a_delimiter_followed_by_junk_is_refused():
    rejects(b"--XyZjunk\r\n" + field("a", b"1") + b"\r\n--XyZ--", "bad boundary line")


def test_truncated_part_headers_are_refused():
    rejects(b'--XyZ\r\nContent-Disposition: form-data; name="a"\r\n', "truncated or oversized part headers")


def test_oversized_part_headers_are_refused():
    rejects(body(b"X-Pad: " + b"p" * 20000 + b"\r\n" + field("a", b"1")), "oversized part headers")


@pytest.mark.parametrize("part, match", [
    (b"Content-Type: text/plain\r\n\r\nx", "no Content-Disposition"),
    (b"\r\nx", "no Content-Disposition"),  # a part with no headers at all
    (b'Content-Disposition: attachment; name="a"\r\n\r\nx', "must be form-data"),
    (b"Content-Disposition: form-data\r\n\r\nx", "must be form-data with a name"),
    (b'Content-Disposition: form-data; filename="f"\r\n\r\nx', "must be form-data with a name"),
    (b'Content-Disposition: form-data; name="a"\r\nContent-Disposition: form-data; name="b"\r\n\r\nx',
     "appears twice"),
    (b'Content-Disposition: form-data; name="a"\r\n folded continuation\r\n\r\nx', "bad part header line"),
    (b'Content-Disposition: form-data; name="a"\r\nno colon here\r\n\r\nx', "bad part header line"),
    (b'Content-Disposition: form-data; name="a"; filename="\xff\xfe"\r\n\r\nx', "not UTF-8"),
    (b"Content-Disposition: form-data; name=\"a\"; filename*=UTF-8''x\r\n\r\nx", "encoded parameter"),
    (b'Content-Disposition: form-data; name="a"; name="b"\r\n\r\nx', "appears twice"),
])
def test_malformed_parts_are_refused(part, match):
    rejects(body(field("ok", b"1"), part), match)


def test_a_non_ascii_boundary_is_refused():
    rejects(b"--\xc3\xa9\r\n\r\n--\xc3\xa9--", "ASCII", "multipart/form-data; boundary=\"é\"")


def test_utf8_part_headers_are_accepted():
    data = body('Content-Disposition: form-data; name="file"; filename="ünï/cödé.loom"\r\n\r\nx'.encode())
    assert parse_multipart(data, CT)[0].filename == "ünï/cödé.loom"

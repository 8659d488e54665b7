"""The reader on mutated files: only `LoomBytecodeError` (with an offset inside the file) or a module.

Deterministic (seeded `random.Random`). Half of the random mutations reseal the header
(body length and CRC32), so they reach the section table and the decoder instead of
stopping at the checksum.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Callable

from bytecode_testlib import reseal, sections, table_end
from loomc.bytecode import LoomBytecodeError, read_module, write_module
from loomc.bytecode.format import HEADER_BYTES
from loomc.bytecode.varint import uvarint
from loomc.bytecode.writer import canonical_module, pack
from loomc.syntax import ast
from loomc.syntax.parse import parse_module
from loomc.syntax.printer import format_module

# Small, but with every kind of item and most statements and expressions.
SOURCE = """\
use "lib.loom" { a, b as c }
config n: i64 = (1 + 2) * 0x10
param w[l in 0..n]: q8_0[n, 32] = checkpoint("w.{l}")
state s: f32[n] per row
kernel k(x: f32[N], out y: f32[N]) {
    parallel for i in 0..N {
        var t: f32 = -x[i]
        for j in 0..2 {
            if j > 0 && !false {
                t += bitcast[f32](u32(j))
            } else {
                break
            }
        }
        y[i] = t
    }
}
command c2(x: f32[N]) -> (y: f32[N]) {
    k(x, y)
}
stage st(x: f32[N]) -> (y: f32[N])
fn f(m: map) -> any {
    let xs = [1, 2.5, "s\\n", b"\\x00", null]
    while true {
        return {"k": xs[0], "m": m}
    }
}
check f {
    expect f({}) != null
}
"""
NUM_MUTANTS = 10_000


def _base() -> bytes:
    return write_module(parse_module(SOURCE, "fuzz.loom"))


# ---- mutations: each takes (data, rng) and returns new bytes -------------------------------------------


def flip_bit(data: bytes, rng: random.Random, lo: int = 0) -> bytes:
    i = rng.randrange(lo, len(data))
    return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]


def set_byte(data: bytes, rng: random.Random, lo: int = 0) -> bytes:
    i = rng.randrange(lo, len(data))
    return data[:i] + bytes([rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])]) + data[i + 1:]


def insert_bytes(data: bytes, rng: random.Random, lo: int = HEADER_BYTES) -> bytes:
    i = rng.randrange(lo, len(data) + 1)
    return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 4))) + data[i:]


def delete_bytes(data: bytes, rng: random.Random, lo: int = HEADER_BYTES) -> bytes:
    i = rng.randrange(lo, len(data))
    return data[:i] + data[i + rng.randint(1, 4):]


def huge_varint(data: bytes, rng: random.Random, lo: int = HEADER_BYTES) -> bytes:
    """Replace one byte with a very large or overlong varint."""
    i = rng.randrange(lo, len(data))
    blob = rng.choice([uvarint(2**64 - 1), uvarint(2**63), uvarint(2**32), b"\xff" * 11 + b"\x01",
                       b"\x80\x00", b"\xff" * rng.randint(1, 12)])
    return data[:i] + blob + data[i + 1:]


def duplicate_chunk(data: bytes, rng: random.Random, lo: int = HEADER_BYTES) -> bytes:
    i = rng.randrange(lo, len(data))
    j = min(len(data), i + rng.randint(1, 24))
    return data[:j] + data[i:j] + data[j:]


BYTE_MUTATIONS = [flip_bit, set_byte, insert_bytes, delete_bytes, huge_varint, duplicate_chunk]


def mutate_inside_section(data: bytes, rng: random.Random) -> bytes:
    """A byte mutation confined to one section, with the table rewritten to match: it reaches the decoder."""
    parts = [(sid, blob) for sid, blob in sections(data)]
    candidates = [k for k, (_, blob) in enumerate(parts) if blob]
    if not candidates:
        return flip_bit(data, rng)
    k = rng.choice(candidates)
    parts[k] = (parts[k][0], rng.choice(BYTE_MUTATIONS)(parts[k][1], rng, 0))
    return pack(parts)


def edit_table(data: bytes, rng: random.Random) -> bytes:
    """Rewrite the section table: swap ids, bend offsets and lengths, drop, repeat or invent entries."""
    parts = sections(data)
    body = data[table_end(data):]
    offsets, at = [], 0
    for _, blob in parts:
        offsets.append(at)
        at += len(blob)
    entries = [[sid, off, len(blob)] for (sid, blob), off in zip(parts, offsets)]
    if not entries:
        return flip_bit(data, rng)
    choice = rng.randrange(6)
    k = rng.randrange(len(entries))
    if choice == 0:
        j = rng.randrange(len(entries))
        entries[k][0], entries[j][0] = entries[j][0], entries[k][0]
    elif choice == 1:
        entries[k][1] = max(0, entries[k][1] + rng.choice([-3, -1, 1, 2, 10**6, 2**40]))
    elif choice == 2:
        entries[k][2] = max(0, entries[k][2] + rng.choice([-2, -1, 1, 5, 2**62]))
    elif choice == 3:
        del entries[k]
    elif choice == 4:
        entries.append(list(entries[k]))
    else:
        entries[k][0] = rng.choice([0, 7, 99, 2**20])
    table = uvarint(len(entries)) + b"".join(uvarint(a) + uvarint(b) + uvarint(c) for a, b, c in entries)
    return data[:HEADER_BYTES] + table + body


def swap_sections(data: bytes, rng: random.Random) -> bytes:
    """Give one section another file's bytes, or a section's own bytes with its tail cut."""
    parts = sections(data)
    if not parts:
        return flip_bit(data, rng)
    k = rng.randrange(len(parts))
    sid, blob = parts[k]
    cut = rng.randrange(len(blob) + 1)
    parts[k] = (sid, blob[:cut] + blob[cut + 1:] if rng.random() < 0.5 else blob[:cut])
    return pack(parts)


def _with_table(mutate: Callable[[bytes, random.Random], bytes]) -> Callable[[bytes, random.Random], bytes]:
    """Table edits need a table that parses; after an earlier mutation there may be none."""

    def mutation(data: bytes, rng: random.Random) -> bytes:
        try:
            return mutate(data, rng)
        except LoomBytecodeError:
            return flip_bit(data, rng)

    return mutation


MUTATIONS: list[Callable[[bytes, random.Random], bytes]] = BYTE_MUTATIONS + [
    _with_table(edit_table), _with_table(swap_sections),
    _with_table(mutate_inside_section), _with_table(mutate_inside_section), _with_table(mutate_inside_section),
]


# ---- the property ------------------------------------------------------------------------------------


def read_or_reject(data: bytes) -> ast.Module | None:
    try:
        module = read_module(data, "fuzz.loombc")
    except LoomBytecodeError as exc:
        assert isinstance(exc.offset, int) and 0 <= exc.offset <= len(data), (exc, len(data))
        return None
    assert isinstance(module, ast.Module)
    return module


def test_the_base_file_is_valid():
    assert read_or_reject(_base()) is not None


def test_every_truncation_is_rejected():
    data = _base()
    for n in range(len(data)):
        assert read_or_reject(data[:n]) is None
        assert read_or_reject(reseal(data[:n])) is None  # the header agrees; the sections do not


def test_mutated_files_only_raise_loom_bytecode_error():
    rng = random.Random(20240611)
    base = _base()
    outcomes: Counter[str] = Counter()
    checked_canonical = 0
    runs = 0
    while runs < NUM_MUTANTS:
        data = base
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            data = rng.choice(MUTATIONS)(data, rng) if len(data) > HEADER_BYTES + 1 else data
        resealed = runs % 2 == 0
        if resealed:
            data = reseal(data)
        runs += 1
        module = read_or_reject(data)
        if module is None:
            outcomes["rejected" + (" after the checksum" if resealed else "")] += 1
            continue
        outcomes["accepted"] += 1
        format_module(module)
        if checked_canonical < 25 and outcomes["accepted"] % 10 == 1:
            # What the reader accepts is an AST the parser produces from its dis text.
            canonical_module(module)
            checked_canonical += 1
    assert runs >= 10_000
    assert outcomes["rejected after the checksum"] > 1000, outcomes
    assert outcomes["accepted"] > 0, outcomes

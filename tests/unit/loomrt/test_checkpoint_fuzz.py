"""The checkpoint readers on mutated files: only `CheckpointError`, and no allocation a header merely claims.

Small valid files of each format (GGUF with every tensor type and metadata value type, safetensors,
CTranslate2, ONNX) are written here, then mutated with a fixed seed: bytes flipped, set, inserted,
deleted or cut off, and little-endian integers of "interesting" sizes (0, 2^32-1, 2^60, 2^64-1, the
file's length, ...) written over the header, where the counts, lengths, dims and offsets live; the
safetensors JSON header is also mutated as JSON (shapes of 2^60 elements, offsets past the end,
reversed or negative offsets, unknown dtypes). Each mutant is opened and every tensor and metadata
value read: the reader may accept the file or raise `CheckpointError`, nothing else (no
IndexError, struct.error, UnicodeDecodeError, MemoryError, ValueError, RecursionError), and the
peak of traced allocations while reading one stays far below what the claims would need.
"""

from __future__ import annotations

import json
import random
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from loomrt.checkpoints import open_checkpoint
from loomrt.errors import CheckpointError
from test_checkpoint_ct2 import write_ct2
from test_checkpoint_onnx import write_model
from test_checkpoints import write_gguf_with_metadata

SEED = 20261204
MUTANTS = 600              # per format
PEAK_BYTES = 64 << 20      # the valid files are a few KiB; a header's claim of 2^60 elements must not be allocated
INTERESTING = [0, 1, 2, 7, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, 1 << 40,
               1 << 60, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def _gguf(tmp: Path) -> bytes:
    return write_gguf_with_metadata(tmp / "valid.gguf").read_bytes()


def _safetensors(tmp: Path) -> bytes:
    rng = np.random.default_rng(1)
    save_file({"a": rng.standard_normal((3, 4)).astype(np.float32), "b": np.arange(6, dtype=np.int32),
               "c": np.zeros((2, 2, 2), np.float16)}, str(tmp / "valid.safetensors"), metadata={"k": "v"})
    return (tmp / "valid.safetensors").read_bytes()


def _ct2(tmp: Path) -> bytes:
    rng = np.random.default_rng(2)
    variables = {"enc/w": rng.standard_normal((3, 5)).astype(np.float16), "enc/b": np.ones(7, np.float32),
                 "heads": np.array(6, np.int16), "ids": np.arange(4, dtype=np.int32).reshape(2, 2)}
    return write_ct2(tmp / "valid.bin", variables, {"dec/tied": "enc/w"}).read_bytes()


def _onnx(tmp: Path) -> bytes:
    rng = np.random.default_rng(3)
    tensors = {"w": rng.standard_normal((4, 3)).astype(np.float32), "q": np.arange(6, dtype=np.int8),
               "s": np.array(0.5, np.float32)}
    return write_model(tmp / "valid.onnx", tensors).read_bytes()


FORMATS = {"gguf": _gguf, "safetensors": _safetensors, "ct2": _ct2, "onnx": _onnx}


# ---- mutations ---------------------------------------------------------------------------------

def _header_end(data: bytes, fmt: str) -> int:
    """Where the dense header (counts, lengths, dims, offsets) ends, roughly: mutations favour it."""
    if fmt == "safetensors":
        return 8 + struct.unpack_from("<Q", data)[0]
    return min(len(data), 1024)


def write_int(data: bytes, rng: random.Random, hi: int) -> bytes:
    width = rng.choice([1, 2, 4, 8])
    value = rng.choice(INTERESTING + [len(data), len(data) - 1, rng.randrange(1 << 16)]) % (1 << (8 * width))
    i = rng.randrange(max(1, min(hi, len(data) - width)))
    return data[:i] + value.to_bytes(width, "little") + data[i + width:]


def byte_edit(data: bytes, rng: random.Random, hi: int) -> bytes:
    i = rng.randrange(max(1, min(hi, len(data))))
    op = rng.randrange(5)
    if op == 0:
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
    if op == 1:
        return data[:i] + bytes([rng.choice([0, 0xFF, 0x80, 0x7F, rng.randrange(256)])]) + data[i + 1:]
    if op == 2:
        return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[i:]
    if op == 3:
        return data[:i] + data[i + rng.randint(1, 16):]
    return data[:i]


def safetensors_json(data: bytes, rng: random.Random) -> bytes:
    """Rewrite the JSON header with one hostile claim, keeping its length prefix right (or not)."""
    n = struct.unpack_from("<Q", data)[0]
    header = json.loads(data[8:8 + n])
    name = rng.choice([k for k in header if k != "__metadata__"])
    entry = header[name]
    op = rng.randrange(9)
    if op == 0:
        entry["shape"] = rng.choice([[1 << 60], [1 << 31, 1 << 31], [-1], [0], [], [2**64], ["3"], [3.5], None])
    elif op == 1:
        entry["data_offsets"] = rng.choice([[0, 1 << 62], [1 << 62, (1 << 62) + 48], [8, 0], [-8, 40], [0],
                                            [0, 48, 96], None, ["0", "48"], [0, len(data)]])
    elif op == 2:
        entry["dtype"] = rng.choice(["F128", "", "f32", "Q4_0", "BOOL", "F8_E4M3", 7, None, "U64"])
    elif op == 3:
        del entry[rng.choice(list(entry))]
    elif op == 4:
        header[name] = rng.choice([[], "x", 1, None, {}])
    elif op == 5:
        header["__metadata__"] = rng.choice([{"k": 1}, [], "x", {"k": {"n": "v"}}, None])
    elif op == 6:
        header[name + "2"] = dict(entry)    # two tensors over the same bytes
    elif op == 7:
        header = {"x" * 100_000: entry}
    else:
        header = rng.choice([[], "x", None, 1])
    text = json.dumps(header).encode()
    if rng.random() < 0.3:
        text += b" " * rng.randrange(16)     # padding the writers add
    prefix = len(text) if rng.random() < 0.8 else rng.choice(INTERESTING)
    return struct.pack("<Q", prefix % (1 << 64)) + text + data[8 + n:]


def mutate(data: bytes, fmt: str, rng: random.Random) -> bytes:
    for _ in range(rng.randint(1, 3)):
        hi = _header_end(data, fmt) if len(data) >= 8 and rng.random() < 0.8 else len(data)
        roll = rng.random()
        if fmt == "safetensors" and roll < 0.4:
            try:
                data = safetensors_json(data, rng)
                continue
            except (ValueError, UnicodeDecodeError, struct.error, IndexError, AttributeError, TypeError):
                pass    # an earlier mutation already broke the header: edit bytes instead
        data = write_int(data, rng, hi) if roll < 0.7 else byte_edit(data, rng, hi)
    return data


# ---- the property ------------------------------------------------------------------------------

def read_everything(path: Path) -> int:
    """Open `path` and read every tensor (and, for GGUF, every metadata value); the tensors read."""
    read = 0
    with open_checkpoint(path) as ckpt:
        for key in getattr(ckpt, "metadata_keys", lambda: [])():
            ckpt.metadata(key)
        for name in ckpt.names():
            ckpt.info(name)
            try:
                ckpt.get(name)
                read += 1
            except CheckpointError:
                continue     # one bad tensor: the others are still read
    return read


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_valid_files_read(tmp_path, fmt):
    path = tmp_path / f"x.{fmt}"
    path.write_bytes(FORMATS[fmt](tmp_path))
    assert read_everything(path) >= 3


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_mutated_files_raise_only_checkpoint_errors(tmp_path, fmt):
    rng = random.Random(f"{SEED}:{fmt}")
    base = FORMATS[fmt](tmp_path)
    path = tmp_path / f"mutant.{fmt}"
    outcomes = {"read": 0, "refused": 0}
    tracemalloc.start()
    try:
        for i in range(MUTANTS):
            data = mutate(base, fmt, rng)
            path.write_bytes(data)
            tracemalloc.reset_peak()
            try:
                read_everything(path)
                outcomes["read"] += 1
            except CheckpointError:
                outcomes["refused"] += 1
            except Exception as exc:   # the property: nothing but our typed error
                (tmp_path / f"failing-{i}.{fmt}").write_bytes(data)
                raise AssertionError(f"mutant {i} of {fmt} raised {type(exc).__name__}: {exc!s:.300} "
                                     f"(saved as failing-{i}.{fmt})") from exc
            peak = tracemalloc.get_traced_memory()[1]
            assert peak < PEAK_BYTES, f"mutant {i} of {fmt}: {peak} bytes allocated while reading {len(data)}"
    finally:
        tracemalloc.stop()
    assert outcomes["refused"] > MUTANTS // 4, outcomes    # the mutations do reach the checks


def test_a_claim_of_2_to_the_60_elements_is_refused_before_allocation(tmp_path):
    """safetensors header and GGUF tensor table claiming 2^60 elements: CheckpointError, no allocation."""
    data = _safetensors(tmp_path)
    n = struct.unpack_from("<Q", data)[0]
    header = json.loads(data[8:8 + n])
    header["a"]["shape"] = [1 << 60]
    text = json.dumps(header).encode()
    (tmp_path / "huge.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])
    gguf = bytearray(_gguf(tmp_path))
    # GGUF: the first tensor's first dim (after its name) claims 2^60
    name = b"f32"
    at = gguf.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4
    gguf[at:at + 8] = struct.pack("<Q", 1 << 60)
    (tmp_path / "huge.gguf").write_bytes(bytes(gguf))
    tracemalloc.start()
    try:
        for path in (tmp_path / "huge.safetensors", tmp_path / "huge.gguf"):
            with pytest.raises(CheckpointError):
                with open_checkpoint(path) as ckpt:
                    for tensor in ckpt.names():
                        ckpt.get(tensor)
        assert tracemalloc.get_traced_memory()[1] < PEAK_BYTES
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("n_dims, dims", [(2, [2**63 + 3, 0]), (2, [2**40, 2**40]), (100, [1] * 100)],
                         ids=["dim-past-int64-times-zero", "product-past-int64", "100-dims"])
def test_gguf_shapes_no_array_can_have_are_refused(tmp_path, n_dims, dims):
    """Found by the fuzzer: a zero dim made a 2^63 + 3 dim pass the end-of-file check, and
    numpy's reshape then raised ValueError. GGUF has at most 4 dims of int64 elements in all."""
    gguf = bytearray(_gguf(tmp_path))
    name = b"f32"
    at = gguf.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)   # n_dims (u32), then 3 dims (u64)
    old = 4 + 8 * struct.unpack_from("<I", gguf, at)[0]
    gguf[at:at + old] = struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", d) for d in dims)
    (tmp_path / "bad.gguf").write_bytes(bytes(gguf))
    with pytest.raises(CheckpointError, match="dimensions|elements"):
        open_checkpoint(tmp_path / "bad.gguf")

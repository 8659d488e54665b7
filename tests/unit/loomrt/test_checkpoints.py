"""loomrt/checkpoints.py: safetensors and GGUF files opened, listed and read in runtime storage."""

import mmap
import os

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

from loomrt.checkpoints import TensorInfo, open_checkpoint
from loomrt.errors import CheckpointError, LoomError
from loomrt.library_pages import SMAPS, read_mappings

Q = gguf.GGMLQuantizationType


def write_gguf(path, tensors, metadata=None, endianess=gguf.GGUFEndian.LITTLE):
    """tensors: {name: (array, GGML type or None)}; quantized arrays are their block bytes.
    metadata: a function that adds key/value pairs to the writer."""
    w = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    if metadata is not None:
        metadata(w)
    for name, (array, raw) in tensors.items():
        if raw is None:
            w.add_tensor(name, array)
        else:
            w.add_tensor(name, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(3)
    w = {name: rng.standard_normal((rows, 64)).astype(np.float32)
         for name, rows in (("q8", 5), ("q40", 3), ("q41", 4))}
    blocks = {"q8": quantize(w["q8"], Q.Q8_0), "q40": quantize(w["q40"], Q.Q4_0), "q41": quantize(w["q41"], Q.Q4_1)}
    return w, blocks


@pytest.fixture
def gguf_file(tmp_path, weights):
    w, blocks = weights
    f32 = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    return write_gguf(tmp_path / "m.gguf", {
        "f32": (f32, None),
        "i32": (np.arange(6, dtype=np.int32).reshape(2, 3), None),
        "blk.0.q8": (blocks["q8"], Q.Q8_0),
        "blk.0.q40": (blocks["q40"], Q.Q4_0),
        "blk.0.q41": (blocks["q41"], Q.Q4_1),
    }), f32


def test_gguf_lists_logical_shapes_and_dtypes(gguf_file):
    path, _ = gguf_file
    with open_checkpoint(path) as ck:
        assert ck.format == "gguf" and len(ck) == 5
        assert ck.names() == ["f32", "i32", "blk.0.q8", "blk.0.q40", "blk.0.q41"]
        # GGUF stores dims fastest-first; the checkpoint reports row-major [N, K].
        assert ck.info("f32") == TensorInfo("f32", "f32", (2, 3, 4))
        assert ck.info("i32") == TensorInfo("i32", "i32", (2, 3))
        assert ck.info("blk.0.q8") == TensorInfo("blk.0.q8", "q8_0", (5, 64))
        assert ck.info("blk.0.q40") == TensorInfo("blk.0.q40", "q4_0", (3, 64))
        assert str(ck.info("blk.0.q41")) == "q4_1[4, 64]"
        assert "f32" in ck and "nope" not in ck


def test_gguf_numeric_tensors(gguf_file):
    path, f32 = gguf_file
    ck = open_checkpoint(path)
    got = ck.get("f32")
    assert got.dtype == np.float32 and got.shape == (2, 3, 4) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, f32)
    np.testing.assert_array_equal(ck.get("i32"), np.arange(6, dtype=np.int32).reshape(2, 3))


@pytest.mark.parametrize("name, qtype, nbytes", [("q8", Q.Q8_0, 34), ("q40", Q.Q4_0, 18), ("q41", Q.Q4_1, 20)])
def test_gguf_quantized_bytes_round_trip(gguf_file, weights, name, qtype, nbytes):
    path, _ = gguf_file
    w, blocks = weights
    got = open_checkpoint(path).get(f"blk.0.{name}")
    assert got.dtype == np.uint8 and got.shape == (w[name].shape[0], 64 // 32 * nbytes)
    assert got.flags.c_contiguous and isinstance(got.base, np.memmap)  # the file's bytes, in place
    np.testing.assert_array_equal(got, blocks[name])
    np.testing.assert_array_equal(dequantize(got, qtype), dequantize(blocks[name], qtype))


def test_gguf_arrays_are_copy_on_write(gguf_file):
    """Writeable (numba compiles read-only arrays as another type), but the file never changes."""
    path, f32 = gguf_file
    before = path.read_bytes()
    got = open_checkpoint(path).get("f32")
    assert got.flags.writeable
    got[...] = -1
    assert path.read_bytes() == before
    np.testing.assert_array_equal(open_checkpoint(path).get("f32"), f32)


def test_gguf_bf16_as_bits(tmp_path):
    bits = np.array([[0x3F80, 0x4000, 0xBF80]], np.uint16)  # 1, 2, -1
    path = write_gguf(tmp_path / "b.gguf", {"b": (bits.view(np.uint8), Q.BF16)})
    ck = open_checkpoint(path)
    assert ck.info("b") == TensorInfo("b", "bf16", (1, 3))
    got = ck.get("b")
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, bits)


def test_gguf_unsupported_type(tmp_path):
    blocks = quantize(np.ones((1, 256), np.float32), Q.Q5_0)
    path = write_gguf(tmp_path / "k.gguf", {"k": (blocks, Q.Q5_0)})
    ck = open_checkpoint(path)
    assert ck.info("k").dtype == "q5_0"
    with pytest.raises(CheckpointError, match=r"tensor 'k' is q5_0, which Loom cannot use"):
        ck.get("k")


def test_safetensors(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    h = np.ones((2,), np.float16)
    i = np.array([[1, 2]], np.int64)
    save_file({"a": a, "h": h, "i": i}, str(tmp_path / "m.safetensors"))
    ck = open_checkpoint(tmp_path / "m.safetensors")
    assert ck.format == "safetensors" and sorted(ck.names()) == ["a", "h", "i"]
    assert ck.info("a") == TensorInfo("a", "f32", (3, 4))
    assert ck.info("h") == TensorInfo("h", "f16", (2,))
    assert ck.info("i") == TensorInfo("i", "i64", (1, 2))
    for name, want in (("a", a), ("h", h), ("i", i)):
        got = ck.get(name)
        assert got.dtype == want.dtype and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    # Memory-mapped (safe_open's get_tensor would copy on every call), copy-on-write, writeable.
    before = (tmp_path / "m.safetensors").read_bytes()
    first, second = ck.get("a"), ck.get("a")
    assert np.shares_memory(first, second) and first.flags.writeable
    first[...] = -1
    assert (tmp_path / "m.safetensors").read_bytes() == before
    ck.close()
    with pytest.raises(CheckpointError, match="is closed"):
        ck.get("a")


def test_safetensors_bf16_as_bits(tmp_path):
    """numpy has no bfloat16: the tensor is memory-mapped from the header offsets."""
    import json
    import struct
    bits = np.array([[0x3F80, 0x4000], [0xBF80, 0x0000]], np.uint16)
    pad = np.ones(3, np.uint8)  # an odd offset before the bf16 data
    header = {"pad": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
              "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [3, 11]}}
    text = json.dumps(header).encode()
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + pad.tobytes() + bits.tobytes())
    ck = open_checkpoint(tmp_path / "b.safetensors")
    assert ck.info("b") == TensorInfo("b", "bf16", (2, 2))
    np.testing.assert_array_equal(ck.get("b"), bits)
    np.testing.assert_array_equal(ck.get("pad"), pad)


def test_missing_tensor_names_near_matches(gguf_file):
    path, _ = gguf_file
    ck = open_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"m\.gguf has no tensor 'blk\.0\.q4'; did you mean .*'blk\.0\.q40'"):
        ck.get("blk.0.q4")
    with pytest.raises(CheckpointError, match=r"has no tensor 'zzz'$"):
        ck.info("zzz")


def test_unreadable_files(tmp_path):
    with pytest.raises(CheckpointError, match="cannot open checkpoint"):
        open_checkpoint(tmp_path / "absent.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="cannot read safetensors checkpoint"):
        open_checkpoint(tmp_path / "junk.safetensors")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\xff" * 12)
    with pytest.raises(CheckpointError, match="cannot read GGUF checkpoint"):
        open_checkpoint(tmp_path / "junk.gguf")


def test_errors_are_loom_errors():
    e = CheckpointError("x")
    assert isinstance(e, LoomError) and e.status == 500 and e.to_dict()["error"]["code"] == "checkpoint_error"


# ---- GGUF: the one reader, checked against gguf.GGUFReader ----------------------------------------

def _metadata(w):
    w.add_string("general.name", "tiny ünïcode")
    w.add_uint32("llama.block_count", 3)
    w.add_float32("llama.rope.freq_base", 10000.5)
    w.add_bool("tokenizer.ggml.add_space_prefix", True)
    w.add_int64("x.i64", -(2 ** 40))
    w.add_float64("x.f64", 0.1)
    w.add_token_list(["<s>", "a", "b", "é"])
    w.add_token_types([3, 1, 1, 1])
    w.add_array("x.nested", [[1, 2], [3]])


def write_gguf_with_metadata(path, endianess=gguf.GGUFEndian.LITTLE):
    """Every tensor type Loom reads from GGUF, and metadata of every value type."""
    rng = np.random.default_rng(5)
    return write_gguf(path, {
        "f32": (rng.standard_normal((2, 3, 4)).astype(np.float32), None),
        "f16": (rng.standard_normal((3, 5)).astype(np.float16), None),
        "f64": (rng.standard_normal((4,)), None),
        "i8": (np.arange(-3, 3, dtype=np.int8).reshape(2, 3), None),
        "i16": (np.arange(6, dtype=np.int16), None),
        "i32": (np.arange(6, dtype=np.int32).reshape(3, 2), None),
        "i64": (np.arange(4, dtype=np.int64) - 2, None),
        "bf16": (np.array([[0x3F80, 0x4000, 0xBF80]], np.uint16).view(np.uint8), Q.BF16),
        "q40": (quantize(rng.standard_normal((2, 64)).astype(np.float32), Q.Q4_0), Q.Q4_0),
    }, _metadata, endianess)


def test_gguf_metadata(tmp_path):
    path = write_gguf_with_metadata(tmp_path / "m.gguf")
    with open_checkpoint(path) as ck:
        assert ck.metadata("general.name") == "tiny ünïcode"
        assert ck.metadata("llama.block_count") == 3
        assert ck.metadata("llama.rope.freq_base") == 10000.5
        assert ck.metadata("tokenizer.ggml.add_space_prefix") is True
        assert ck.metadata("x.i64") == -(2 ** 40) and ck.metadata("x.f64") == 0.1
        assert ck.metadata("tokenizer.ggml.tokens") == ["<s>", "a", "b", "é"]
        assert ck.metadata("tokenizer.ggml.token_type") == [3, 1, 1, 1]
        assert ck.metadata("x.nested") == [[1, 2], [3]]
        assert ck.metadata("absent") is None and ck.metadata("absent", 7) == 7
        assert ck.metadata_keys()[:2] == ["general.architecture", "general.name"]
    with pytest.raises(CheckpointError, match="is closed"):
        ck.metadata("general.name")
    with pytest.raises(CheckpointError, match="is closed"):
        ck.get("f32")


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_gguf_agrees_with_gguf_reader(tmp_path, endianess):
    """Names, dtypes, shapes, values and metadata are what gguf's own reader makes of the file."""
    path = write_gguf_with_metadata(tmp_path / "m.gguf", endianess)
    reader = gguf.GGUFReader(str(path))
    ck = open_checkpoint(path)
    assert ck.names() == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = ck.info(t.name)
        assert info.dtype == Q(int(t.tensor_type)).name.lower()
        assert info.shape == tuple(reversed(t.shape.tolist()))
        got = ck.get(t.name)
        want = t.data.view(t.data.dtype.newbyteorder(">") if endianess == gguf.GGUFEndian.BIG else t.data.dtype)
        if info.dtype == "bf16":
            want = want.view(np.dtype(np.uint16).newbyteorder(got.dtype.byteorder))
        if info.dtype != "q4_0":
            want = want.reshape(info.shape)
        assert got.shape == want.shape and got.flags.writeable and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
        assert got.dtype.itemsize == want.dtype.itemsize and got.dtype.kind == want.dtype.kind
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "x.nested":  # GGUFReader flattens nested arrays
            assert ck.metadata(key) == pytest.approx(field.contents()), key


def test_gguf_truncated_and_damaged(tmp_path, gguf_file):
    path, _ = gguf_file
    data = path.read_bytes()
    (tmp_path / "short.gguf").write_bytes(data[:-8])  # the last tensor's data is cut
    ck = open_checkpoint(tmp_path / "short.gguf")
    with pytest.raises(CheckpointError, match="runs past the end of the file"):
        ck.get("blk.0.q41")
    (tmp_path / "header.gguf").write_bytes(data[:40])  # cut inside the metadata
    with pytest.raises(CheckpointError, match="cannot read GGUF checkpoint"):
        open_checkpoint(tmp_path / "header.gguf")
    (tmp_path / "v1.gguf").write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(CheckpointError, match="GGUF version 1 is not supported"):
        open_checkpoint(tmp_path / "v1.gguf")


def test_several_files_read_as_one_checkpoint(tmp_path, gguf_file):
    from loomrt.checkpoints import open_checkpoints

    gguf_file, _ = gguf_file
    extra = tmp_path / "projector.safetensors"
    save_file({"projector.fc1.weight": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(extra))
    with open_checkpoint(gguf_file) as alone:
        gguf_names = alone.names()
    with open_checkpoints([gguf_file, extra]) as ckpt:
        assert ckpt.names() == gguf_names + ["projector.fc1.weight"]
        assert ckpt.info("projector.fc1.weight") == TensorInfo("projector.fc1.weight", "f32", (2, 3))
        assert ckpt.get("projector.fc1.weight").tolist() == [[0, 1, 2], [3, 4, 5]]
        assert ckpt.get(gguf_names[0]).shape == open_checkpoint(gguf_file).get(gguf_names[0]).shape
        assert "projector.fc1.weight" in ckpt and "nope" not in ckpt
        with pytest.raises(CheckpointError, match="have no tensor 'projector.fc1.weigth'; did you mean"):
            ckpt.info("projector.fc1.weigth")
    twin = tmp_path / "twin.safetensors"
    save_file({"projector.fc1.weight": np.zeros((1,), np.float32)}, str(twin))
    with pytest.raises(CheckpointError, match="'projector.fc1.weight' is in both projector.safetensors and twin"):
        open_checkpoints([extra, twin])


def _mapped_rss(path) -> int:
    """Resident bytes of this process's mappings of `path`."""
    return sum(m.rss for m in read_mappings(SMAPS.read_text()) if m.path == str(path))


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads resident pages from /proc/self/smaps")
def test_release_gives_back_pages_no_kept_array_views(tmp_path):
    """Preparation copies some tensors (concatenations) and keeps others as views: after
    `release`, only the views' pages stay resident; the views keep their values (even ones
    written in place), and a released tensor reads the file's bytes again."""
    rng = np.random.default_rng(5)
    tensors = {name: rng.standard_normal((64, 1024)).astype(np.float32) for name in ("a", "b", "c")}   # 256 KiB each
    path = write_gguf(tmp_path / "big.gguf", {name: (t, None) for name, t in tensors.items()})
    with open_checkpoint(path) as ckpt:
        kept = ckpt.get("b")
        backwards = ckpt.get("c")[::-1]                          # a view whose first element is its last byte
        copies = [ckpt.get("a").copy(), ckpt.get("c").copy()]   # every page read
        kept[0, 0] = 7.0                                         # a view written in place (copy-on-write)
        assert np.isfinite(kept.sum())                           # and read whole: resident
        before = _mapped_rss(path)
        assert ckpt.release([kept, backwards]) <= tensors["a"].nbytes + 4096   # only a's pages: c is viewed
        given = ckpt.release([kept])
        after = _mapped_rss(path)
        assert given >= 2 * tensors["a"].nbytes - 2 * 4096 * 2 and given % mmap.PAGESIZE == 0
        assert after <= before - given + 4096 and after >= kept.nbytes - 2 * 4096
        assert kept[0, 0] == 7.0
        np.testing.assert_array_equal(kept[1:], tensors["b"][1:])
        np.testing.assert_array_equal(ckpt.get("a"), tensors["a"])
        np.testing.assert_array_equal(copies[1], tensors["c"])
    assert open_checkpoint(path).release([]) >= 3 * tensors["a"].nbytes - 4096

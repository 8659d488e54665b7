"""GGUF checkpoints through `gguf.GGUFReader` (memory-mapped copy-on-write: the file is never
written, and the arrays are writeable so numba compiles the same kernel specializations as for
ordinary arrays; read-only arrays are a distinct numba type and would compile every kernel again).

GGUF lists a tensor's dims fastest-first: a PyTorch-style `[N, K]` weight is `(K, N)` in
the file's metadata. `TensorInfo.shape` is the reversed, row-major logical shape that a
`.loom` param declares. Quantized tensors stay their raw block bytes (the reader already
shapes them `[..., K / 32 * bytes_per_block]`); BF16 comes out as uint16 bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

from loomrt.checkpoints import Checkpoint, TensorInfo
from loomrt.errors import CheckpointError

DTYPES = {Q.F32: "f32", Q.F16: "f16", Q.BF16: "bf16", Q.F64: "f64", Q.I8: "i8", Q.I16: "i16", Q.I32: "i32",
          Q.I64: "i64", Q.Q4_0: "q4_0", Q.Q4_1: "q4_1", Q.Q8_0: "q8_0"}


class GgufCheckpoint(Checkpoint):
    format = "gguf"

    def __init__(self, path: Path):
        super().__init__(path)
        try:
            self._reader = GGUFReader(str(path), "c")
        except Exception as exc:  # the reader raises ValueError/OSError/struct.error on bad files
            raise CheckpointError(f"cannot read GGUF checkpoint {path}: {exc}") from None
        self._tensors = {}
        for t in self._reader.tensors:
            qtype = Q(int(t.tensor_type))
            dtype = DTYPES.get(qtype, qtype.name.lower())
            self._infos[t.name] = TensorInfo(t.name, dtype, tuple(int(d) for d in reversed(t.shape.tolist())))
            self._tensors[t.name] = t

    def close(self) -> None:
        self._reader = None

    def _load(self, info: TensorInfo) -> np.ndarray:
        data = self._tensors[info.name].data
        if info.dtype == "bf16":
            data = data.view(np.uint16)
        if info.dtype not in ("q4_0", "q4_1", "q8_0"):
            return data.reshape(info.shape)
        if not info.shape or data.shape[:-1] != info.shape[:-1]:
            raise CheckpointError(f"checkpoint {self.path.name}: '{info.name}' has block bytes of shape "
                                  f"{list(data.shape)} for {info}")
        return data  # already [..., K / 32 * bytes_per_block]

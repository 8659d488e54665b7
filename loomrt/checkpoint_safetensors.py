"""Safetensors checkpoints: `safetensors.safe_open(..., framework="numpy")` validates the file
and lists its tensors; the data is memory-mapped from the header's offsets.

`safe_open(...).get_tensor` copies each tensor into a fresh array on every call (and numpy has
no bfloat16), so tensors are views of one copy-on-write `np.memmap` of the file instead:
no copy, the file is never written, and the arrays are writeable, so numba compiles the
same kernel specializations as for ordinary arrays. BF16 comes out as its uint16 bits (the
runtime's bf16 storage). A tensor whose offset is not aligned to its item size is copied."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors import safe_open

from loomrt.checkpoints import Checkpoint, TensorInfo
from loomrt.errors import CheckpointError
from loomc.run.launch import HOST_STORAGE


class SafetensorsCheckpoint(Checkpoint):
    format = "safetensors"

    def __init__(self, path: Path):
        super().__init__(path)
        try:
            self._file = safe_open(str(path), framework="numpy")
            keys = list(self._file.keys())
            for name in keys:
                s = self._file.get_slice(name)
                raw = s.get_dtype()
                # safetensors spells dtypes as Loom does, in upper case ("BF16"; `loomc.dtypes`).
                self._infos[name] = TensorInfo(name, raw.lower(), tuple(int(d) for d in s.get_shape()))
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors raises its own SafetensorError and OSError
            raise CheckpointError(f"cannot read safetensors checkpoint {path}: {exc}") from None
        self._raw: np.memmap | None = None
        self._offsets: dict[str, int] | None = None  # tensor name -> file offset of its data

    def close(self) -> None:
        self._file = None
        self._raw = None

    def _load(self, info: TensorInfo) -> np.ndarray:
        if self._file is None:
            raise CheckpointError(f"checkpoint {self.path.name} is closed")
        if self._offsets is None:
            try:
                with open(self.path, "rb") as f:
                    (n,) = struct.unpack("<Q", f.read(8))
                    header = json.loads(f.read(n))
                self._offsets = {k: 8 + n + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}
                self._raw = np.memmap(self.path, dtype=np.uint8, mode="c")
            except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
                raise CheckpointError(f"cannot read safetensors checkpoint {self.path}: {exc}") from None
        dtype = np.dtype(HOST_STORAGE[info.dtype]).newbyteorder("<")
        return self._mapped(self._raw, info, self._offsets[info.name], dtype, info.shape)

"""GGUF checkpoints: the one reader of GGUF files, for tensors (`get`) and metadata (`metadata`).

The file (llama.cpp's GGUF, versions 2 and 3) is `GGUF`, a u32 version, u64 tensor and
key/value counts, the key/value metadata, the tensor table (name, dims fastest-first, GGML type,
offset), then the tensor data from the next multiple of `general.alignment` (32 by default).
Opening parses the header and steps over the metadata values without building them; `metadata`
decodes a value when asked (the tokenizer's vocabulary: `loomrt.tokenizer`). `gguf.GGUFReader`,
which this replaced, built a numpy view per array element: 2.3 s to open SmolLM2-135M for its
49152-token vocabulary, against well under 0.1 s here.

GGUF lists a tensor's dims fastest-first: a PyTorch-style `[N, K]` weight is `(K, N)` in
the file's metadata. `TensorInfo.shape` is the reversed, row-major logical shape that a
`.loom` param declares. Tensors are views of one copy-on-write `np.memmap` of the file (the
file is never written, and the arrays are writeable so numba compiles the same kernel
specializations as for ordinary arrays; read-only arrays are a distinct numba type and would
compile every kernel again), in the dtype's host storage (`loomc.dtypes`): quantized tensors
stay their raw block bytes `[..., K / 32 * bytes_per_block]`, BF16 comes out as uint16 bits."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from loomc.dtypes import DTYPES
from loomc.run.launch import HOST_STORAGE, storage_shape
from loomrt.checkpoints import Checkpoint, TensorInfo
from loomrt.errors import CheckpointError

VERSIONS = (2, 3)  # version 1 had 32-bit counts
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses more, and numpy cannot reshape to thousands
MAX_ELEMENTS = 2**63 - 1  # llama.cpp's int64 element counts; a larger dim cannot even be a numpy shape
# Metadata value types: struct codes of the scalars, and the two compound types.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def dtype_name(ggml_type: int) -> str:
    """The `.loom` dtype of a GGML tensor type: its GGML name in lower case ("q4_0", "bf16"),
    which is how Loom spells the types it supports (`loomc.dtypes`) and names those it does not."""
    try:
        return GGMLQuantizationType(ggml_type).name.lower()
    except ValueError:
        return f"ggml_type_{ggml_type}"


class _Cursor:
    """Reads header values from `buf` at `pos` in the file's byte order (`end`: "<" or ">")."""

    def __init__(self, buf: memoryview, pos: int, end: str):
        self.buf, self.pos, self.end = buf, pos, end

    def unpack(self, fmt: str) -> tuple:
        fmt = self.end + fmt
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def string(self, keep: bool = True) -> str | None:
        (n,) = self.unpack("Q")
        self.pos += n
        if self.pos > len(self.buf):
            raise ValueError("a string runs past the end of the file")
        return str(self.buf[self.pos - n:self.pos], "utf-8") if keep else None

    def value(self, vtype: int, keep: bool = True) -> Any:
        """The value of type `vtype` here (None, having stepped over it, unless `keep`)."""
        if vtype == _STRING:
            return self.string(keep)
        if vtype == _ARRAY:
            itype, n = self.unpack("IQ")
            if itype in _SCALARS:
                fmt = f"{n}{_SCALARS[itype]}"
                if keep:
                    return list(self.unpack(fmt))
                self.pos += struct.calcsize(self.end + fmt)
                return None
            items = [self.value(itype, keep) for _ in range(n)]
            return items if keep else None
        if vtype not in _SCALARS:
            raise ValueError(f"unknown metadata value type {vtype}")
        (v,) = self.unpack(_SCALARS[vtype])
        return v


class GgufCheckpoint(Checkpoint):
    format = "gguf"

    def __init__(self, path: Path):
        super().__init__(path)
        self._fields: dict[str, tuple[int, int]] = {}  # metadata key -> (value type, offset of the value)
        self._offsets: dict[str, int] = {}  # tensor name -> file offset of its data
        try:
            self._raw: np.memmap | None = np.memmap(self.path, dtype=np.uint8, mode="c")
            self._buf: memoryview | None = memoryview(self._raw)
            self._read_header()
        except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
            self.close()
            raise CheckpointError(f"cannot read GGUF checkpoint {path}: {exc}") from None

    def _read_header(self) -> None:
        buf = self._buf
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("not a GGUF file")
        # A file of the other byte order reads its (small) version byte-swapped: 0 in the low half.
        self._end = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
        cur = _Cursor(buf, 4, self._end)
        (version,) = cur.unpack("I")
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported (only {', '.join(map(str, VERSIONS))})")
        tensor_count, kv_count = cur.unpack("QQ")
        for _ in range(kv_count):
            key = cur.string()
            (vtype,) = cur.unpack("I")
            self._fields[key] = (vtype, cur.pos)
            cur.value(vtype, keep=False)
        table = []
        for _ in range(tensor_count):
            name = cur.string()
            (n_dims,) = cur.unpack("I")
            if n_dims > MAX_DIMS:
                raise ValueError(f"tensor '{name}' has {n_dims} dimensions (GGUF allows at most {MAX_DIMS})")
            dims = cur.unpack(f"{n_dims}Q")
            if any(d > MAX_ELEMENTS for d in dims) or math.prod(dims) > MAX_ELEMENTS:
                raise ValueError(f"tensor '{name}' claims dims {list(dims)}, more than 2^63 - 1 elements")
            ggml_type, offset = cur.unpack("IQ")
            table.append((name, tuple(reversed(dims)), ggml_type, offset))
        alignment = self.metadata("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment!r} is not a power of two")
        start = -(-cur.pos // alignment) * alignment
        for name, shape, ggml_type, offset in table:
            self._infos[name] = TensorInfo(name, dtype_name(ggml_type), shape)
            self._offsets[name] = start + offset

    def close(self) -> None:
        self._buf = None
        self._raw = None

    def metadata_keys(self) -> list[str]:
        """The metadata keys, in file order."""
        return list(self._fields)

    def metadata(self, key: str, default: Any = None) -> Any:
        """The value of metadata `key` (a str, int, float or bool, or a list of them), or `default`
        if the file has no such key."""
        found = self._fields.get(key)
        if found is None:
            return default
        if self._buf is None:
            raise CheckpointError(f"checkpoint {self.path.name} is closed")
        vtype, pos = found
        try:
            return _Cursor(self._buf, pos, self._end).value(vtype)
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read GGUF checkpoint {self.path}: metadata '{key}': {exc}") from None

    def _load(self, info: TensorInfo) -> np.ndarray:
        block = DTYPES[info.dtype].block_elems
        if block and (not info.shape or info.shape[-1] % block):
            raise CheckpointError(f"checkpoint {self.path.name}: '{info.name}' is {info}, "
                                  f"but {info.dtype} stores blocks of {block} along the last dimension")
        dtype = np.dtype(HOST_STORAGE[info.dtype]).newbyteorder(self._end)
        return self._mapped(self._raw, info, self._offsets[info.name], dtype, storage_shape(info.dtype, info.shape))

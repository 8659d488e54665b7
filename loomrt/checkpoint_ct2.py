"""CTranslate2 checkpoints (`model.bin`): named tensors from the format CTranslate2's converters write.

    u32 version          (this reader knows 1..6)
    str spec name        e.g. "WhisperSpec"      str: u16 byte length, then the bytes, NUL-terminated
    u32 spec revision    (version >= 2)
    u32 variable count
    per variable:        str name, u8 rank, u32 dims[rank], u8 dtype, u32 byte count, bytes
    u32 alias count      (version >= 3)
    per alias:           str alias, str target    (a second name for the same tensor)

dtypes: 0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16. The file is memory-mapped (copy-on-write)
and each tensor is a view of it; every length, count and offset is checked against the
file before it is used, so a truncated or hostile file is a `CheckpointError` naming the
byte offset, never a crash or an unbounded allocation. Rank-0 variables (the spec's flags
and sizes, e.g. `encoder/num_heads`) are tensors of shape `()`.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from loomc.run.launch import HOST_STORAGE
from loomrt.checkpoints import Checkpoint, TensorInfo
from loomrt.errors import CheckpointError

DTYPES = {0: "f32", 1: "i8", 2: "i16", 3: "i32", 4: "f16", 5: "bf16"}
ITEM_BYTES = {"f32": 4, "i8": 1, "i16": 2, "i32": 4, "f16": 2, "bf16": 2}
MAX_VERSION = 6
MAX_RANK = 8
MAX_STRING = 4096


def looks_like_ct2(head: bytes) -> bool:
    """Whether a file's first bytes are a CTranslate2 header: a known version, then a spec name."""
    if len(head) < 8:
        return False
    version, length = struct.unpack_from("<IH", head)
    return 1 <= version <= MAX_VERSION and 1 <= length <= MAX_STRING


class _Reader:
    """A bounds-checked cursor over the mapped bytes."""

    def __init__(self, data: np.ndarray, path: Path):
        self.data, self.path, self.at = data, path, 0

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"cannot read CTranslate2 checkpoint {self.path.name}: {what} at byte {self.at}")

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise self.fail(f"{n} more bytes needed, the file ends")
        out = bytes(self.data[self.at:self.at + n])
        self.at += n
        return out

    def u(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.u("H")
        if not 1 <= n <= MAX_STRING:
            raise self.fail(f"a string of {n} bytes")
        raw = self.take(n)
        if raw[-1:] != b"\0":
            raise self.fail("a string without its NUL terminator")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("a string that is not UTF-8") from None


class Ct2Checkpoint(Checkpoint):
    format = "ctranslate2"

    def __init__(self, path: Path):
        super().__init__(path)
        try:
            self._raw: np.memmap | None = np.memmap(path, dtype=np.uint8, mode="c")
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot open checkpoint {path}: {exc}") from None
        self._offsets: dict[str, int] = {}
        r = _Reader(self._raw, self.path)
        version = r.u("I")
        if not 1 <= version <= MAX_VERSION:
            raise r.fail(f"version {version} (this reader knows 1..{MAX_VERSION})")
        self.spec = r.string()
        self.revision = r.u("I") if version >= 2 else 1
        count = r.u("I")
        if count > len(self._raw) // 8:   # every variable takes at least 8 bytes of header
            raise r.fail(f"{count} variables in a file of {len(self._raw)} bytes")
        for _ in range(count):
            name = r.string()
            rank = r.u("B")
            if rank > MAX_RANK:
                raise r.fail(f"variable '{name}' of rank {rank}")
            shape = tuple(r.u("I") for _ in range(rank))
            code = r.u("B")
            if code not in DTYPES:
                raise r.fail(f"variable '{name}' of unknown dtype {code}")
            dtype = DTYPES[code]
            nbytes = r.u("I")
            want = int(np.prod(shape, dtype=np.int64)) * ITEM_BYTES[dtype]
            if nbytes != want:
                raise r.fail(f"variable '{name}' {dtype}{list(shape)} declares {nbytes} bytes, not {want}")
            if name in self._infos:
                raise r.fail(f"a second variable named '{name}'")
            self._infos[name] = TensorInfo(name, dtype, shape)
            self._offsets[name] = r.at
            r.take(nbytes)
        if version >= 3:
            for _ in range(r.u("I")):
                alias, target = r.string(), r.string()
                if target not in self._infos:
                    raise r.fail(f"alias '{alias}' of an unknown variable '{target}'")
                if alias in self._infos:
                    raise r.fail(f"alias '{alias}' names an existing variable")
                self._infos[alias] = TensorInfo(alias, self._infos[target].dtype, self._infos[target].shape)
                self._offsets[alias] = self._offsets[target]
        if r.at != len(self._raw):
            raise r.fail(f"{len(self._raw) - r.at} bytes after the last record")

    def close(self) -> None:
        self._raw = None

    def _load(self, info: TensorInfo) -> np.ndarray:
        dtype = np.dtype(HOST_STORAGE[info.dtype]).newbyteorder("<")
        return self._mapped(self._raw, info, self._offsets[info.name], dtype, info.shape)


__all__ = ["Ct2Checkpoint", "looks_like_ct2"]

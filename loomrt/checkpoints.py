"""Checkpoints: named tensors read from a weights file, in the storage the runtime binds.

`open_checkpoint(path)` picks the format (GGUF by its magic bytes, ONNX by the start of a
ModelProto, CTranslate2 by its header, else safetensors) and returns a `Checkpoint`:

    names()        the tensor names, in file order
    info(name)     TensorInfo(name, dtype, shape): the `.loom` dtype and the *logical*
                   row-major shape (GGUF lists dims fastest-first; this is reversed back)
    get(name)      the tensor's storage array (memory-mapped where the format allows)

Storage is what `loomc.run.launch` binds: a numeric tensor is a numpy array of its dtype
(bf16 as uint16 bits); a q4_0/q4_1/q8_0 tensor of logical shape `[..., K]` is its raw
GGUF block bytes, a uint8 array `[..., K / 32 * bytes_per_block]`, never dequantized.
Failures are `CheckpointError`s.
"""

from __future__ import annotations

import difflib
import math
import mmap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.array_utils import byte_bounds

from loomc.dtypes import DTYPES
from loomrt.errors import CheckpointError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


class Checkpoint:
    """One open weights file. Subclasses fill `_infos` and implement `_load`."""

    format = "?"

    def __init__(self, path: Path):
        self.path = Path(path)
        self._infos: dict[str, TensorInfo] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path} ({len(self._infos)} tensors)>"

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def __len__(self) -> int:
        return len(self._infos)

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Drop this object's references to the file; arrays already handed out stay valid."""

    def release(self, kept: Iterable[np.ndarray]) -> int:
        """Give back the memory of the file's pages that no array in `kept` views (bytes
        given back). Preparation reads every tensor; those it copied (concatenated,
        transformed) stay resident in the mapping as long as any view keeps it alive, and
        would count in the process's memory beside their copies. The pages stay mapped:
        reading one again refaults it from the file."""
        return release_unviewed(getattr(self, "_raw", None), kept)

    def names(self) -> list[str]:
        return list(self._infos)

    def describe(self) -> str:
        """How messages name this checkpoint."""
        return f"checkpoint {self.path.name} has"

    def missing(self, name: str) -> str:
        """The message for a name this checkpoint lacks, with the nearest names it has."""
        near = difflib.get_close_matches(name, self._infos, n=3)
        hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
        return f"{self.describe()} no tensor '{name}'{hint}"

    def info(self, name: str) -> TensorInfo:
        found = self._infos.get(name)
        if found is None:
            raise CheckpointError(self.missing(name))
        return found

    def get(self, name: str) -> np.ndarray:
        info = self.info(name)
        if info.dtype not in SUPPORTED_DTYPES:
            raise CheckpointError(f"checkpoint {self.path.name}: tensor '{name}' is {info.dtype}, "
                                  f"which Loom cannot use (supported: {', '.join(SUPPORTED_DTYPES)})")
        return self._load(info)

    def _load(self, info: TensorInfo) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _mapped(self, raw: np.memmap | None, info: TensorInfo, start: int, dtype: np.dtype,
                shape: tuple[int, ...]) -> np.ndarray:
        """`info`'s tensor, stored as `dtype[shape]` from byte `start` of the file that `raw` maps
        (copy-on-write): a view, copied only when `start` is not a multiple of the item size."""
        if raw is None:
            raise CheckpointError(f"checkpoint {self.path.name} is closed")
        if any(d < 0 or d >= 2**63 for d in shape):   # a header's claim no array can have
            raise CheckpointError(f"checkpoint {self.path.name}: '{info.name}' has an impossible shape {list(shape)}")
        end = start + math.prod(shape) * dtype.itemsize
        if end > len(raw):
            raise CheckpointError(f"checkpoint {self.path.name}: '{info.name}' ({info}) runs past the end of the file")
        data = raw[start:end]
        if start % dtype.itemsize:
            data = data.copy()
        return data.view(dtype).reshape(shape)


SUPPORTED_DTYPES = tuple(DTYPES)


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open a GGUF, ONNX (its initializers), CTranslate2 (`model.bin`) or safetensors file; the format is read from the
    file's first bytes, never from its name."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)    # a GGUF is known by 4 bytes: read no more before deciding
            if head != GGUF_MAGIC:
                head += f.read(4)
    except OSError as exc:
        raise CheckpointError(f"cannot open checkpoint {path}: {exc.strerror or exc}") from None
    if head == GGUF_MAGIC:
        from loomrt.checkpoint_gguf import GgufCheckpoint
        return GgufCheckpoint(path)
    from loomrt.checkpoint_onnx import OnnxCheckpoint, looks_like_onnx
    if looks_like_onnx(head):
        return OnnxCheckpoint(path)
    from loomrt.checkpoint_ct2 import Ct2Checkpoint, looks_like_ct2
    if looks_like_ct2(head):
        return Ct2Checkpoint(path)
    from loomrt.checkpoint_safetensors import SafetensorsCheckpoint
    return SafetensorsCheckpoint(path)


class CheckpointSet(Checkpoint):
    """Several open checkpoints read as one: every name is in exactly one of them."""

    format = "set"

    def __init__(self, parts: list[Checkpoint]):
        super().__init__(parts[0].path)
        self.parts = parts
        self._owner: dict[str, Checkpoint] = {}
        for part in parts:
            for name in part.names():
                if name in self._owner:
                    raise CheckpointError(f"tensor '{name}' is in both {self._owner[name].path.name} and "
                                          f"{part.path.name}: a checkpoint's files must not share names")
                self._owner[name] = part
                self._infos[name] = part.info(name)

    def __repr__(self) -> str:
        return f"<CheckpointSet {', '.join(str(p.path) for p in self.parts)} ({len(self._infos)} tensors)>"

    def describe(self) -> str:
        return f"checkpoint files {', '.join(p.path.name for p in self.parts)} have"

    def get(self, name: str) -> np.ndarray:
        self.info(name)
        return self._owner[name].get(name)

    def close(self) -> None:
        for part in self.parts:
            part.close()

    def release(self, kept: Iterable[np.ndarray]) -> int:
        kept = list(kept)
        return sum(part.release(kept) for part in self.parts)


class Prefixed(Checkpoint):
    """One checkpoint whose every tensor is named `prefix + name`: an image deployment's a-th
    LoRA adapter file reads as `lora.{a}.<name>` beside the base weights."""

    def __init__(self, part: Checkpoint, prefix: str):
        super().__init__(part.path)
        self.part, self.prefix = part, prefix
        self.format = part.format
        self._infos = {prefix + name: TensorInfo(prefix + name, i.dtype, i.shape) for name, i in part._infos.items()}

    def get(self, name: str) -> np.ndarray:
        self.info(name)
        return self.part.get(name[len(self.prefix):])

    def close(self) -> None:
        self.part.close()

    def release(self, kept: Iterable[np.ndarray]) -> int:
        return self.part.release(kept)


def release_unviewed(raw: np.memmap | None, kept: Iterable[np.ndarray]) -> int:
    """`madvise(MADV_DONTNEED)` every whole page of the copy-on-write file mapping `raw` that
    no array in `kept` overlaps; bytes advised. Only for pages nothing reads any more: one
    that was written (copy-on-write) would come back with the file's bytes."""
    advise = getattr(mmap, "MADV_DONTNEED", None)
    handle = getattr(raw, "_mmap", None)
    if raw is None or advise is None or handle is None or raw.offset != 0:
        return 0
    start, size, page = raw.ctypes.data, raw.nbytes, mmap.PAGESIZE
    spans = (byte_bounds(a) for a in kept if isinstance(a, np.ndarray) and a.nbytes)   # strided views included
    views = sorted((low - start, high - start) for low, high in spans if high > start and low < start + size)
    given, at = 0, 0
    for low, high in views + [(size, size)]:
        first, last = -(-at // page) * page, low // page * page   # whole pages strictly between views
        if last > first:
            handle.madvise(advise, first, last - first)
            given += last - first
        at = max(at, high)
    return given


def open_checkpoints(paths: list[str | Path] | tuple[str | Path, ...],
                     prefixed: tuple[tuple[str, str | Path], ...] = ()) -> Checkpoint:
    """One checkpoint file (`open_checkpoint`), or several read as one namespace (`CheckpointSet`),
    with each `(prefix, path)` of `prefixed` added under its prefix (`Prefixed`)."""
    if len(paths) == 1 and not prefixed:
        return open_checkpoint(paths[0])
    parts: list[Checkpoint] = []
    try:
        for path in paths:
            parts.append(open_checkpoint(path))
        for prefix, path in prefixed:
            parts.append(Prefixed(open_checkpoint(path), prefix))
        return CheckpointSet(parts)
    except BaseException:
        for part in parts:
            part.close()
        raise


__all__ = ["Checkpoint", "CheckpointSet", "Prefixed", "SUPPORTED_DTYPES", "TensorInfo", "open_checkpoint", "open_checkpoints"]

"""The `mini` model package (fixtures/mini) for runtime tests: documents and the weights they load.

The weights are written by the test into its own directory as safetensors; the document
points at the package's `.loom` files by absolute path, so a test can vary any field.
`mini_image_document` adds a declared `image` component (its providers, prepare program,
checkpoint and the text kind's tokenizer are written into the test's directory too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

MINI = Path(__file__).resolve().parent / "fixtures" / "mini"
DIM = 8


def mini_weights(directory: Path, seed: int = 0, name: str = "mini.safetensors",
                 dim: int = DIM) -> tuple[Path, np.ndarray, np.ndarray]:
    """Weights for `mini` (a document may widen it with `config: {"dim": dim}`)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((dim, dim)).astype(np.float32)
    b = rng.standard_normal(dim).astype(np.float32)
    path = directory / name
    save_file({"proj.weight": w, "proj.bias": b}, str(path))
    return path, w, b


def mini_document(directory: Path, **fields: Any) -> str:
    """A model document for `mini` whose checkpoint is written into `directory`."""
    checkpoint, _, _ = mini_weights(directory)
    doc: dict[str, Any] = json.loads((MINI / "model.json").read_text())
    doc.update(control=str(MINI / "control.loom"), prepare=str(MINI / "prepare.loom"),
               sources=[str(MINI / "model.loom")], checkpoint=str(checkpoint))
    for key, value in fields.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return json.dumps(doc)


def mini_image_document(directory: Path, **fields: Any) -> tuple[str, np.ndarray]:
    """`mini` as a `text` deployment that declares an `image` component, and that component's
    one param (`v: f32[dim]`, from `vision.scale` in its own checkpoint). The text kind needs a
    tokenizer: a two-word one. The program declares no text stage, so the deployment is
    native-only (served by the plain StageService), which residency tests do not mind."""
    (directory / "image_prepare.loom").write_text(
        f'use "{(MINI / "control.loom").as_posix()}" {{ dim }}\n\n'
        'param v: f32[dim] = checkpoint("vision.scale")\n')
    (directory / "image.loom").write_text('use "image_prepare.loom" { v }\n')
    scale = np.arange(1, DIM + 1, dtype=np.float32)
    save_file({"vision.scale": scale}, str(directory / "vision.safetensors"))
    Tokenizer(WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]")).save(str(directory / "tokenizer.json"))
    image = {"sources": [str(directory / "image.loom")], "prepare": str(directory / "image_prepare.loom"),
             "checkpoint": str(directory / "vision.safetensors")}
    return mini_document(directory, kind="text", tokenizer=str(directory / "tokenizer.json"),
                         components={"image": image}, **fields), scale

"""The `mini` model package (fixtures/mini) for runtime tests: documents and the weights they load.

The weights are written by the test into its own directory as safetensors; the document
points at the package's `.loom` files by absolute path, so a test can vary any field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

MINI = Path(__file__).resolve().parent / "fixtures" / "mini"
DIM = 8


def mini_weights(directory: Path, seed: int = 0, name: str = "mini.safetensors") -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((DIM, DIM)).astype(np.float32)
    b = rng.standard_normal(DIM).astype(np.float32)
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

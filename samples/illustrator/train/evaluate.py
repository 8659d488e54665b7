"""Does the illustrator follow the prompt? The held-out check of issue 20, and the contact sheet.

For each of the 50 held-out prompts of split.json ("a picture of a fox face": a caption form
never seen in training), one 64 x 64 image (seed 0) is compared with every training emoji
by a simple metric the model never saw: L2 distance between 16 x 16 box-downsampled RGB
pictures (on white). The prompt counts as followed when the named emoji is the nearest
(top 1), or among the 5 nearest (top 5).

    python evaluate.py [--guidance G]        -> eval_results.md (the table) and contact_sheet.png
                                               (torch sampler, seed 0; needs data.py's cache)
    python evaluate.py --set validation --guidance G -> the same score on the validation set (how the
                                               sampler's guidance was chosen)

`rank_of` and `thumbnails` are what tests/numerics/test_illustrator_reference.py uses on
the images Loom serves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
SPLIT = HERE / "split.json"
THUMB = 16   # data.py's thumbnail side


def thumbnails(images: np.ndarray) -> np.ndarray:
    """[N, H, W, 3] uint8 -> [N, 16 * 16 * 3] float64, box-downsampled."""
    return np.stack([np.asarray(Image.fromarray(i).resize((THUMB, THUMB), Image.BOX), np.float64).reshape(-1)
                     for i in images])


def rank_of(image: np.ndarray, target: int, references: np.ndarray) -> int:
    """0-based rank of reference `target` among `references` (thumbnails) by L2 distance to `image`."""
    d = ((references - thumbnails(image[None])[0]) ** 2).sum(axis=1)
    return int((d < d[target]).sum())


def main() -> None:
    import argparse

    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(HERE))
    from data import CACHE, read_thumbnails
    from model import UNet, sample, splitmix_noise, to_uint8

    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=["eval", "validation"], default="eval")
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--adapters", action="store_true", help="write adapters_sheet.png instead (base, sketch, ink)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.adapters:
        adapters_sheet(args.guidance)
        return
    split = json.loads(SPLIT.read_text())
    cps, held = split["emoji"], split[args.set]
    refs = read_thumbnails(len(cps))
    texts = torch.from_numpy(np.load(CACHE / f"{args.set}.npy"))
    net = UNet()
    net.load_state_dict(load_file(HERE.parent / "weights" / "unet.safetensors"))
    net.eval()
    noise = torch.cat([splitmix_noise(0, 64, 64) for _ in held])
    images = to_uint8(sample(net, texts, noise, guidance=args.guidance)).numpy()
    ranks = [rank_of(img, cps.index(e["cp"]), refs) for img, e in zip(images, held)]
    top1 = sum(r == 0 for r in ranks) / len(ranks)
    top5 = sum(r < 5 for r in ranks) / len(ranks)
    print(f"{args.set} guidance {args.guidance}: top1 {top1:.2f} top5 {top5:.2f}")
    if args.set != "eval":
        return
    lines = [f"# Held-out prompts (torch sampler, seed 0, guidance {args.guidance})", "",
             f"top 1: {top1:.0%}, top 5: {top5:.0%} of {len(ranks)} prompts", "",
             "| prompt | rank of the named emoji |", "| --- | ---: |"]
    lines += [f"| {e['prompt']} | {r + 1} |" for e, r in zip(held, ranks)]
    (HERE / "eval_results.md").write_text("\n".join(lines) + "\n")
    sheet = Image.new("RGB", (10 * 64, 5 * 64), "white")
    for i, img in enumerate(images):
        sheet.paste(Image.fromarray(img), ((i % 10) * 64, (i // 10) * 64))
    sheet.save(HERE / "contact_sheet.png", optimize=True)


SHEET_PROMPTS = ["red apple", "fox face", "snowflake", "rocket", "smiling face with open mouth", "dolphin"]


def adapters_sheet(guidance: float) -> None:
    """adapters_sheet.png: SHEET_PROMPTS (seed 0) drawn by the base model, then with `sketch` at
    scale 1, then with `ink` at scale 1, one row each."""
    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(HERE))
    from data import embed
    from model import UNet, sample, splitmix_noise, to_uint8
    from train import load_adapter

    net = UNet()
    net.load_state_dict(load_file(HERE.parent / "weights" / "unet.safetensors"))
    for style in ("sketch", "ink"):
        load_adapter(net, style, load_file(HERE.parent / "weights" / f"lora_{style}.safetensors"))
    net.eval()
    texts = torch.from_numpy(embed(SHEET_PROMPTS))
    noise = torch.cat([splitmix_noise(0, 64, 64) for _ in SHEET_PROMPTS])
    sheet = Image.new("RGB", (len(SHEET_PROMPTS) * 64, 3 * 64), "white")
    for row, style in enumerate([None, "sketch", "ink"]):
        scales = None if style is None else {style: torch.ones(len(SHEET_PROMPTS))}
        with torch.no_grad():
            images = to_uint8(sample(net, texts, noise, guidance=guidance, scales=scales)).numpy()
        for i, img in enumerate(images):
            sheet.paste(Image.fromarray(img), (i * 64, row * 64))
    sheet.save(HERE / "adapters_sheet.png", optimize=True)


if __name__ == "__main__":
    main()

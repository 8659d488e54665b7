"""loss*.csv -> loss.png (Pillow): the base model's training loss (every 10th step, grey; red:
its 20-point mean) and, under it, each adapter's."""

from __future__ import annotations

import csv
from pathlib import Path

from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent
W, H, M = 640, 240, 48


def panel(title: str, rows: list[dict]) -> Image.Image:
    steps = [int(r["step"]) for r in rows]
    ys = [float(r["loss"]) for r in rows]
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    top = max(ys) * 1.05
    X = lambda s: M + (W - 2 * M) * s / max(1, steps[-1])
    Y = lambda v: H - M - (H - 2 * M) * v / top
    d.line([(M, M), (M, H - M), (W - M, H - M)], fill="black")
    for k in range(5):
        v = top * k / 4
        d.text((4, Y(v) - 6), f"{v:.2f}", fill="black")
        d.line([(M - 4, Y(v)), (W - M, Y(v))], fill=(225, 225, 225))
    d.line([(X(s), Y(v)) for s, v in zip(steps, ys)], fill=(170, 170, 170))
    mean = [sum(ys[max(0, i - 19):i + 1]) / len(ys[max(0, i - 19):i + 1]) for i in range(len(ys))]
    d.line([(X(s), Y(v)) for s, v in zip(steps, mean)], fill=(200, 30, 30), width=2)
    d.text((M, 12), f"{title}: flow-matching loss ({steps[-1] + 1} steps; red: 20-point mean)", fill="black")
    d.text((W - M - 30, H - M + 12), f"step {steps[-1]}", fill="black")
    return img


def main() -> None:
    panels = []
    for name, title in (("loss.csv", "base UNet"), ("loss_sketch.csv", "sketch adapter"), ("loss_ink.csv", "ink adapter")):
        if (HERE / name).exists():
            panels.append(panel(title, list(csv.DictReader(open(HERE / name)))))
    out = Image.new("RGB", (W, H * len(panels)), "white")
    for i, p in enumerate(panels):
        out.paste(p, (0, i * H))
    out.save(HERE / "loss.png", optimize=True)


if __name__ == "__main__":
    main()

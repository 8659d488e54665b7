"""loss.csv -> loss.png (Pillow; the LM stage's per-step loss, grey, and its 20-step mean)."""

import csv
from pathlib import Path

from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent


def main() -> None:
    rows = [r for r in csv.DictReader(open(HERE / "loss.csv")) if r["stage"] == "lm"]
    ys = [float(r["loss"]) for r in rows]
    W, H, M = 640, 360, 48
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    top = max(ys) * 1.05
    X = lambda i: M + (W - 2 * M) * i / max(1, len(ys) - 1)
    Y = lambda v: H - M - (H - 2 * M) * v / top
    d.line([(M, M), (M, H - M), (W - M, H - M)], fill="black")
    for v in range(0, int(top) + 1):
        d.text((8, Y(v) - 6), f"{v:.0f}", fill="black")
        d.line([(M - 4, Y(v)), (W - M, Y(v))], fill=(225, 225, 225))
    d.line([(X(i), Y(v)) for i, v in enumerate(ys)], fill=(170, 170, 170))
    mean = [sum(ys[max(0, i - 19):i + 1]) / len(ys[max(0, i - 19):i + 1]) for i in range(len(ys))]
    d.line([(X(i), Y(v)) for i, v in enumerate(mean)], fill=(200, 30, 30), width=2)
    d.text((M, 12), f"scout vision projector: LM-stage caption loss per step ({len(ys)} steps; red: 20-step mean)", fill="black")
    d.text((W // 2 - 20, H - M + 12), "step", fill="black")
    img.save(HERE / "loss.png", optimize=True)


if __name__ == "__main__":
    main()

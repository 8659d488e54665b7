"""Emoji renderings for the scout vision projector (issue 21): the data recipe.

Every single-codepoint emoji that Debian's `fonts-noto-color-emoji` renders in colour
(`/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf`, its one bitmap size 109, Pillow's
`embedded_color=True`) is drawn onto a 224 x 224 RGB canvas with augmentation: scale (glyph
side 64..200 px), offset (anywhere that keeps the glyph inside), a background colour (uniform
RGB, half of them light), and with probability 1/2 a slight Gaussian blur (radius 0.3..1.2).
Captions come from `unicodedata.name`: lower-cased, with an article, "A fox face.",
"An alarm clock.".

Split (fixed, seed 21, written to `split.json` next to this file):
  * `unseen`: 10 % of the emoji (seeded shuffle), never rendered for training; the eval
    renders each once (`eval_unseen`).
  * `train`: the other 90 %; `AUGS_PER_EMOJI` renderings each with seeds (emoji index, 0..k-1).
  * `eval_seen`: 100 emoji from `train`, each rendered once more with a seed never used for
    training (a new augmentation of a seen emoji). Those 100 renderings are also committed as
    one picture, `eval_seen.png` (10 x 10 tiles of 224 x 224, in the split's order), so the
    test suite can ask the served model about them without the font
    (tests/conformance/test_image_input.py).
A rendering is fully determined by (codepoint, augmentation seed): `render(cp, seed)`.

Usage: python build_data.py  -> writes split.json and eval_seen.png (no other rendering is
stored; features.py re-renders them from the split and caches the encoder features outside
the repo).

`names(answer, head)` is the naming rule every evaluation uses (evaluate.py, serve_eval.py,
the test suite): the head noun appears in the answer as a word, or with a plural "s"/"es".
"""

from __future__ import annotations

import json
import random
import re
import sys
import unicodedata
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT = "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf"
FONT_SIZE = 109
SIZE = 224
SEED = 21
AUGS_PER_EMOJI = 14
UNSEEN_FRACTION = 0.10
EVAL_SEEN = 100
EVAL_SEED_BASE = 1_000_000  # augmentation seeds for eval renderings; training uses 0..AUGS_PER_EMOJI-1
HERE = Path(__file__).resolve().parent
SPLIT = HERE / "split.json"
ATLAS = HERE / "eval_seen.png"   # the eval_seen renderings, ATLAS_COLUMNS to a row, in the split's order
ATLAS_COLUMNS = 10

# Code point ranges that hold emoji; the font's own coverage decides which exist.
RANGES = [(0x203C, 0x3299), (0x1F000, 0x1FAFF)]
# Not pictures on their own: regional indicators, skin-tone modifiers, hair components.
EXCLUDE = set(range(0x1F1E6, 0x1F200)) | set(range(0x1F3FB, 0x1F400)) | set(range(0x1F9B0, 0x1F9B4))


@lru_cache(maxsize=1)
def font() -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(FONT, FONT_SIZE)


def glyph(cp: int) -> Image.Image | None:
    """The emoji's colour bitmap cropped to its ink, RGBA; None when the font lacks it."""
    canvas = Image.new("RGBA", (160, 160), (0, 0, 0, 0))
    try:
        ImageDraw.Draw(canvas).text((8, 8), chr(cp), font=font(), embedded_color=True)
    except OSError:
        return None
    a = np.asarray(canvas)
    if a[..., 3].max() == 0:
        return None
    rgb = a[..., :3][a[..., 3] > 0].astype(np.int64)
    if rgb.std(axis=0).max() < 1.0:  # a flat (monochrome fallback) glyph, not a colour emoji
        return None
    return canvas.crop(canvas.getbbox())


def caption(cp: int) -> str:
    name = unicodedata.name(chr(cp)).lower()
    article = "An" if name[0] in "aeiou" else "A"
    return f"{article} {name}."


PREPOSITIONS = {"with", "of", "on", "in", "for", "and", "at", "without", "from", "to", "over", "under", "into", "facing"}


def head_noun(cp: int) -> str:
    """The last word before the first preposition: 'fox face' -> 'face', 'face with tears of
    joy' -> 'face', 'red apple' -> 'apple' (issue 21's acceptance criterion)."""
    words = unicodedata.name(chr(cp)).lower().replace("-", " ").split()
    head = []
    for w in words:
        if w in PREPOSITIONS and head:
            break
        head.append(w)
    return head[-1]


def names(answer: str, word: str) -> bool:
    """Whether `answer` names `word`: as a whole word, or with a plural "s"/"es"; hyphens read
    as spaces, case ignored."""
    return re.search(rf"\b{re.escape(word)}(s|es)?\b", answer.lower().replace("-", " ")) is not None


def all_words(answer: str, caption: str) -> bool:
    """Whether `answer` names every word of the caption's name but its prepositions."""
    words = [w for w in caption[caption.index(" ") + 1:-1].replace("-", " ").split() if w not in PREPOSITIONS]
    return all(names(answer, w) for w in words)


def emoji() -> list[int]:
    out = []
    for lo, hi in RANGES:
        for cp in range(lo, hi + 1):
            if cp in EXCLUDE:
                continue
            if not unicodedata.name(chr(cp), "") or unicodedata.category(chr(cp)).startswith("M"):
                continue  # unnamed, or a combining mark (the keycap enclosure)
            if glyph(cp) is not None:
                out.append(cp)
    return out


def render(cp: int, seed: int) -> Image.Image:
    """One augmented 224 x 224 RGB rendering of code point `cp`, determined by (cp, seed)."""
    rng = random.Random(cp * 7_919 + seed * 104_729 + SEED)
    g = glyph(cp)
    side = rng.randint(64, 200)
    scale = side / max(g.size)
    g = g.resize((max(1, round(g.width * scale)), max(1, round(g.height * scale))), Image.LANCZOS)
    if rng.random() < 0.5:
        bg = tuple(rng.randint(190, 255) for _ in range(3))  # light
    else:
        bg = tuple(rng.randint(0, 255) for _ in range(3))
    img = Image.new("RGB", (SIZE, SIZE), bg)
    x = rng.randint(0, SIZE - g.width)
    y = rng.randint(0, SIZE - g.height)
    img.paste(g, (x, y), g)
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.2)))
    return img


def build() -> dict:
    cps = emoji()
    rng = random.Random(SEED)
    order = cps[:]
    rng.shuffle(order)
    n_unseen = round(len(order) * UNSEEN_FRACTION)
    unseen = sorted(order[:n_unseen])
    train = sorted(order[n_unseen:])
    eval_seen = sorted(rng.sample(train, EVAL_SEEN))
    entry = lambda cp, seed: {"cp": cp, "seed": seed, "caption": caption(cp), "head": head_noun(cp)}
    return {
        "note": "generated by build_data.py; eval entries are (cp, augmentation seed)",
        "font": FONT, "font_size": FONT_SIZE, "size": SIZE, "seed": SEED,
        "n_emoji": len(cps), "n_train_emoji": len(train), "n_unseen_emoji": len(unseen),
        "augs_per_emoji": AUGS_PER_EMOJI,
        "train_emoji": train,  # training renderings: (cp, seed) for seed in range(augs_per_emoji)
        "unseen_emoji": unseen,
        "eval_seen": [entry(cp, EVAL_SEED_BASE + i) for i, cp in enumerate(eval_seen)],
        "eval_unseen": [entry(cp, EVAL_SEED_BASE + i) for i, cp in enumerate(unseen)],
    }


def train_entries(split: dict) -> list[dict]:
    return [{"cp": cp, "seed": s, "caption": caption(cp), "head": head_noun(cp)}
            for cp in split["train_emoji"] for s in range(split["augs_per_emoji"])]


def load_split() -> dict:
    split = json.loads(SPLIT.read_text())
    split["train"] = train_entries(split)
    return split


def write_eval_atlas(split: dict) -> None:
    """eval_seen.png: every eval_seen rendering, tiled ATLAS_COLUMNS to a row in the split's order."""
    entries = split["eval_seen"]
    rows = -(-len(entries) // ATLAS_COLUMNS)
    atlas = Image.new("RGB", (SIZE * ATLAS_COLUMNS, SIZE * rows))
    for i, e in enumerate(entries):
        atlas.paste(render(e["cp"], e["seed"]), ((i % ATLAS_COLUMNS) * SIZE, (i // ATLAS_COLUMNS) * SIZE))
    atlas.save(ATLAS, "PNG", optimize=True)


if __name__ == "__main__":
    split = build()
    SPLIT.write_text(json.dumps(split, indent=0, ensure_ascii=False) + "\n")
    write_eval_atlas(split)
    split["train"] = train_entries(split)
    print(f"{split['n_emoji']} emoji: {split['n_train_emoji']} train ({len(split['train'])} renderings), "
          f"{split['n_unseen_emoji']} unseen; eval_seen {len(split['eval_seen'])}, eval_unseen {len(split['eval_unseen'])}")
    if len(sys.argv) > 1:  # python build_data.py DIR: write a contact sheet of a few renders
        d = Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)
        sheet = Image.new("RGB", (SIZE * 6, SIZE * 2))
        for i, e in enumerate(split["train"][::len(split["train"]) // 6][:6] + split["eval_unseen"][:6]):
            sheet.paste(render(e["cp"], e["seed"]), ((i % 6) * SIZE, (i // 6) * SIZE))
        sheet.save(d / "sheet.png")

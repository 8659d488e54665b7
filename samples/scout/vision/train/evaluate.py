"""Greedy answers of the frozen SmolLM2 + trained projector on the held-out renderings.

For each entry of split.json's `eval_seen` (training emoji, new augmentation seeds) and
`eval_unseen` (emoji never used in training), the prompt layout of common.py with
"What is in this image? Answer in a few words.", greedy decoding (f32, at most 16 new tokens,
stopping at <|im_end|>). An answer *names* the emoji when the head noun of its Unicode name
(build_data.head_noun: the last word before the first preposition, 'face with tears of joy' ->
'face') appears in it as a word (a plural 's'/'es' allowed). Also reported: `all words`, every
word of the name (minus 'with', 'of', ...) in the answer.

Both sets are capped at --limit (100) renderings, evenly spaced over the split's list.

Usage: python evaluate.py [--detail auto|low] [--limit N] [--out results.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_data import all_words, load_split, names  # noqa: E402
from common import DETAIL_POOL, END, PREFIX, PROMPT, SUFFIX_AFTER_PROMPT, Projector, ids, load_lm, pool8  # noqa: E402
from features import CACHE  # noqa: E402


@torch.no_grad()
def generate(lm, tok, proj, feats8, k, batch=25, max_new=16):
    embed = lm.get_input_embeddings()
    pre = embed(torch.tensor(ids(tok, PREFIX)))
    suf = embed(torch.tensor(ids(tok, PROMPT + SUFFIX_AFTER_PROMPT)))
    end_id = tok.convert_tokens_to_ids(END)
    out = []
    for i in range(0, len(feats8), batch):
        img = proj(pool8(feats8[i:i + batch], k))
        B = img.shape[0]
        x = torch.cat([pre.expand(B, -1, -1), img, suf.expand(B, -1, -1)], dim=1)
        r = lm(inputs_embeds=x, use_cache=True)
        cache, nxt = r.past_key_values, r.logits[:, -1].argmax(-1)
        toks = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool)
        for _ in range(max_new):
            for b in range(B):
                if not done[b]:
                    if nxt[b].item() == end_id:
                        done[b] = True
                    else:
                        toks[b].append(nxt[b].item())
            if done.all():
                break
            r = lm(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
            cache, nxt = r.past_key_values, r.logits[:, -1].argmax(-1)
        out += [tok.decode(t, skip_special_tokens=True).strip() for t in toks]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--detail", default="auto", choices=sorted(DETAIL_POOL))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--weights", default=str(HERE / "projector.safetensors"))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    split = load_split()
    tok, lm = load_lm()
    sd = load_file(args.weights)
    hidden = sd["projector.fc1.weight"].shape[0]
    proj = Projector(hidden)
    proj.load_state_dict({k.removeprefix("projector."): v for k, v in sd.items()})
    k = DETAIL_POOL[args.detail]
    lines = []
    for name in ("eval_seen", "eval_unseen"):
        n = len(split[name])
        sel = np.unique(np.linspace(0, n - 1, min(n, args.limit)).round().astype(int))  # evenly spaced
        entries = [split[name][i] for i in sel]
        feats = torch.from_numpy(np.load(CACHE / f"{name}.npy")[sel])
        t = time.time()
        answers = generate(lm, tok, proj, feats, k)
        hit = [names(a, e["head"]) for a, e in zip(answers, entries)]
        full = [all_words(a, e["caption"]) for a, e in zip(answers, entries)]
        lines.append(f"\n### {name} (detail={args.detail}, {len(entries)} renderings, {time.time() - t:.0f}s)\n")
        lines.append("| emoji | caption (target) | head noun | answer | named |")
        lines.append("|---|---|---|---|---|")
        for e, a, h in zip(entries, answers, hit):
            lines.append(f"| U+{e['cp']:04X} | {e['caption']} | {e['head']} | {a.replace('|', '/')} | {'yes' if h else 'no'} |")
        lines.append(f"\n**{name}: head noun named {sum(hit)}/{len(hit)} = {100 * sum(hit) / len(hit):.0f} %; "
                     f"all name words {sum(full)}/{len(full)} = {100 * sum(full) / len(full):.0f} %**")
        print("\n".join(lines[-len(entries) - 4:]), flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
